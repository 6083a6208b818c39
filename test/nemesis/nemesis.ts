/**
 * One nemesis run: the world of world.ts under the flow load of test/cluster/flows.ts (hold flows and
 * slot flows through the SDK), the seed's plan of faults applied at their moments (schedule.ts,
 * faults.ts), and the flow model's safety rules checked as the replies come:
 *
 * - every second: each new reply against its flow's history (FlowLoad's wrong answers), and the holds
 *   granted per user against the user's limit as the clients saw them (clientOverGrants);
 * - every five seconds: the database (checkDatabase: the invariant per user, every acknowledged grant
 *   and commit durable, no ledger key twice, usage totals equal to the ledger);
 * - at the end, every fault healed and every call resolved: all of flowSafety (Postgres against the
 *   clients, slots held at once against the plan, every acknowledged consume in the ledger, usage
 *   equal to what the clients were charged).
 *
 * Two more things are violations, though not of the invariant: a process that exits other than by the
 * nemesis's kill (a crash is a bug; seen within a second), and an SDK call that never resolved (every
 * call must end in an answer once the faults heal: one that failed with the SDK's retries exhausted,
 * or one still in flight past the SDK's own bound when the load stops). Such a call leaves its user
 * uncertain; what Postgres says of that user's unfinished flow is reported apart, not as a violation.
 */
import { partitionOf } from "../../src/domain/partition.js"
import type { ServeProcess } from "../support/processes.js"
import { clientOverGrants, sleep, waitForBalance, withoutDecisions } from "../cluster/cluster.js"
import { FlowLoad, flowSafety } from "../cluster/flows.js"
import { checkDatabase } from "../support/databaseChecks.js"
import { applyFault, healAll } from "./faults.js"
import type { FaultEvent, FaultKind } from "./schedule.js"
import { makeSchedule } from "./schedule.js"
import type { NemesisWorld } from "./world.js"
import { closeWorld, currentServe, isRunning, openWorld, ownerOfServe } from "./world.js"

export interface NemesisOptions {
  readonly seed: number
  /** How long faults are applied; the run adds start-up, healing and the final checks. */
  readonly faultsMs: number
  readonly kinds: ReadonlyArray<FaultKind>
  readonly clock: boolean
  readonly members?: number
  readonly partitions?: number
  readonly leaseMs?: number
  /** The processes' store query timeout: what a sleeping COMMIT must outlast. */
  readonly queryTimeoutMs?: number
  readonly workers?: number
  readonly intensity?: number
  /** Stop applying faults at the first violation (the run still heals and checks). */
  readonly stopOnViolation?: boolean
  readonly log?: (line: string) => void
}

export interface Violation {
  /** ms from the start of the faults when it was seen; the final checks count from then too. */
  readonly atMs: number
  readonly what: string
}

export interface AppliedFault extends FaultEvent {
  readonly startedMs: number
  readonly what: string
}

export interface NemesisResult {
  readonly seed: number
  readonly kinds: ReadonlyArray<FaultKind>
  readonly faultsMs: number
  readonly planned: number
  readonly applied: ReadonlyArray<AppliedFault>
  readonly calls: Record<string, number>
  readonly counts: FlowLoad["counts"] & { consumes: number; commits: number }
  readonly failedCalls: number
  readonly uncertainUsers: number
  readonly violations: ReadonlyArray<Violation>
  /** What Postgres holds of flows cut short by calls that never resolved (not safety). */
  readonly unresolved: ReadonlyArray<string>
  /** Processes that ended other than by the nemesis's kill. */
  readonly exits: ReadonlyArray<string>
  readonly balancedAfterHealMs: number | undefined
  readonly wallMs: number
  /** Every process's whole log (decision lines included), for a failure's evidence. */
  readonly logs: ReadonlyArray<{ readonly name: string; readonly text: string }>
}

const defaults = { members: 3, partitions: 16, leaseMs: 6_000, queryTimeoutMs: 1_000, workers: 24 }

/**
 * The load's SDK retries: enough to outlast any run's faults (1 000 attempts at most 250 ms apart: at
 * least ~4 min even when every attempt fails at once), so that "never resolved" means not answered
 * once everything healed, not "a partition's owner was faulted longer than 60 attempts take" (about
 * 15 s when the answers are fast `unavailable`s: seed 302 exhausted them so, with its partitions'
 * owner losing its member lock twice and its storage stalling twice back to back).
 */
const loadRetry = { attemptsMax: 1_000, delayMsMax: 250 }

/**
 * How long the load may take to stop once every fault healed: a call still in flight then never
 * resolved (its partition is answered again within seconds of the heal when all is well).
 */
const loadStopMsMax = 80_000

/** Watches the replies and the database while the faults run; collects violations once each. */
class Monitor {
  readonly violations: Array<Violation> = []
  private readonly seen = new Set<string>()
  private wrongSeen = 0
  private lastDatabaseCheck = 0
  /** How far each process's output was read for duplicate refusals (a whole line's end). */
  private readonly scanned = new Map<ServeProcess, number>()

  constructor(
    private readonly world: NemesisWorld,
    private readonly load: FlowLoad,
    private readonly startedAt: number,
    /** Processes ended by the nemesis's kill: every other exit is a violation. */
    private readonly killed: ReadonlySet<ServeProcess>,
    private readonly log: (line: string) => void
  ) {}

  /** A process that ended on its own (not killed by the nemesis): a crash, with its last words. */
  checkExits(): void {
    if (this.world.closing.value) return
    for (const member of this.world.members)
      member.incarnations.forEach((serve, incarnation) => {
        if (isRunning(serve) || this.killed.has(serve)) return
        const last = withoutDecisions(serve.output()).trimEnd().split("\n").at(-1) ?? ""
        this.add(
          `process exited on its own: m${member.index} #${incarnation} ` +
            `(${serve.child.exitCode ?? serve.child.signalCode}); last line: ${last.slice(0, 400)}`
        )
      })
  }

  /**
   * A write Postgres refused because its ledger key was applied already (`usage_ledger_applied_once`):
   * the process decided again a change that had landed (in a commit of unknown outcome), so its memory
   * was behind the database (issue 26, item 1). The constraint kept the ledger right this time; the
   * state the process decided from was wrong, and whatever else it decided from it went through.
   */
  checkDuplicateRefusals(): void {
    for (const member of this.world.members)
      member.incarnations.forEach((serve, incarnation) => {
        const output = serve.output()
        const from = this.scanned.get(serve) ?? 0
        const to = output.lastIndexOf("\n") + 1
        if (to <= from) return
        this.scanned.set(serve, to)
        for (const line of output.slice(from, to).split("\n")) {
          if (!line.includes("usage_ledger_applied_once")) continue
          const entry = parseLogLine(line)
          const atMs = (entry.time ?? Date.now()) - this.startedAt
          this.add(
            `memory behind the database: m${member.index} #${incarnation} wrote for ${entry.user ?? "?"} ` +
              `a ledger key already applied (usage_ledger_applied_once) at +${atMs} ms`,
            atMs
          )
        }
      })
  }

  /** Every call that failed (the SDK's retries exhausted): it never resolved. */
  checkFailures(): void {
    for (const failure of this.load.failures) {
      const partition = partitionOf(failure.user, this.world.partitions)
      const sent = failure.sentAt === undefined ? "" : ` sent at +${failure.sentAt - this.startedAt} ms,`
      this.add(
        `call never resolved: ${failure.op} ${failure.user} (partition ${partition})${sent} ` +
          `failed at +${failure.at - this.startedAt} ms: ${failure.what}`,
        failure.at - this.startedAt
      )
    }
  }

  add(what: string, atMs = Date.now() - this.startedAt): void {
    if (this.seen.has(what)) return
    this.seen.add(what)
    this.violations.push({ atMs, what })
    this.log(`+${atMs} ms VIOLATION ${what}`)
  }

  async check(): Promise<void> {
    const { load } = this
    for (const answer of load.wrongAnswers.slice(this.wrongSeen)) {
      const partition = partitionOf(answer.user, this.world.partitions)
      this.add(
        `wrong answer: ${answer.op} ${answer.user} (partition ${partition}) ${answer.what}: ${answer.status}`,
        answer.at - this.startedAt
      )
    }
    this.wrongSeen = load.wrongAnswers.length
    this.checkExits()
    this.checkFailures()
    this.checkDuplicateRefusals()
    for (const overGrant of clientOverGrants(load)) this.add(`over-grant: ${overGrant}`)
    if (Date.now() - this.lastDatabaseCheck >= 5_000) {
      this.lastDatabaseCheck = Date.now()
      const report = await checkDatabase(this.world.database.pool, load.snapshot())
      for (const violation of report.violations) this.add(`database: ${violation}`)
    }
  }
}

/** A process's JSON log line, or nothing of it when the line is not JSON. */
const parseLogLine = (line: string): { time?: number; user?: string } => {
  try {
    return JSON.parse(line) as { time?: number; user?: string }
  } catch {
    return {}
  }
}

/** Whether a violation text is about one of these users' flows (`user/id`, `user:`). */
const aboutUsers = (what: string, users: ReadonlySet<string>): boolean =>
  [...users].some((user) => what.includes(`${user}/`) || what.includes(`${user}:`))

export const runNemesis = async (options: NemesisOptions): Promise<NemesisResult> => {
  const settings = { ...defaults, ...options }
  const log = options.log ?? ((line: string) => console.log(line))
  const wallStarted = Date.now()
  const schedule = makeSchedule({
    seed: options.seed,
    faultsMs: options.faultsMs,
    members: settings.members,
    kinds: options.kinds,
    queryTimeoutMs: settings.queryTimeoutMs,
    // One process alone may be cut off too (else a run of one would never apply a disrupting fault).
    disruptedMax: Math.max(1, settings.members - 1),
    ...(options.intensity === undefined ? {} : { intensity: options.intensity })
  })
  log(
    `nemesis seed ${options.seed}: ${schedule.length} faults (${options.kinds.join(", ")}) over ` +
      `${options.faultsMs} ms; replay with QUOTA_NEMESIS_SEED=${options.seed}`
  )
  let world: NemesisWorld | undefined
  let running: FlowLoad | undefined
  try {
    world = await openWorld({
      ...settings,
      clock: options.clock && options.kinds.includes("clock"),
      standby: options.kinds.includes("standbyStall")
    })
    const load = await FlowLoad.start({
      servers: world.nats.url,
      prefix: world.prefix,
      partitions: world.partitions,
      label: "nem",
      workers: settings.workers,
      // Few hold users, so each reaches its limit within a run: an over-grant needs a user near it.
      holdUsersPerPartition: 1,
      slotUsersPerPartition: 2,
      seed: options.seed,
      retry: loadRetry
    })
    running = load
    const startedAt = Date.now()
    // The processes' logs carry epoch ms: this is their +0 of the fault times.
    log(`+0 ms faults start at ${startedAt} (${new Date(startedAt).toISOString()})`)
    const killed = new Set<ServeProcess>()
    const monitor = new Monitor(world, load, startedAt, killed, log)
    const applied: Array<AppliedFault> = []
    let stopping = false
    const open = world
    const faultsDone = Promise.all(
      schedule.map(async (event) => {
        await sleep(event.at - (Date.now() - startedAt))
        if (stopping) return
        const startedMs = Date.now() - startedAt
        if (event.kind === "kill") killed.add(currentServe(open.members[event.member]!))
        const what = await applyFault(open, event).catch(
          (error: unknown) => `${event.kind} m${event.member} failed: ${String(error)}`
        )
        applied.push({ ...event, startedMs, what })
        log(`+${startedMs} ms ${what}`)
      })
    )
    let faultsOver = false
    void faultsDone.then(() => {
      faultsOver = true
    })
    while (!faultsOver) {
      await sleep(1_000)
      await monitor.check().catch((error: unknown) => log(`online check failed: ${String(error)}`))
      if (monitor.violations.length > 0 && options.stopOnViolation === true) stopping = true
    }
    await faultsDone
    await healAll(world)
    const healedAt = Date.now()
    log(`+${healedAt - startedAt} ms every fault healed`)
    await Promise.all(
      world.members.map((member) => Promise.race([currentServe(member).ready, sleep(15_000)]))
    )
    const owners = world.members.flatMap((member) => ownerOfServe(currentServe(member)) ?? [])
    const balancedAfterHealMs = await waitForBalance(
      world.database.pool,
      world.partitions,
      owners,
      30_000
    ).then(
      () => Date.now() - healedAt,
      () => undefined
    )
    await sleep(2_000)
    const stopped = await Promise.race([load.stop().then(() => true), sleep(loadStopMsMax).then(() => false)])
    if (stopped) running = undefined
    for (const call of load.inFlight) {
      const partition = partitionOf(call.user, world.partitions)
      monitor.add(
        `call never resolved: ${call.op} ${call.user} (partition ${partition}) sent at ` +
          `+${call.sentAt - startedAt} ms, still in flight ${loadStopMsMax} ms after the load was told to stop`
      )
    }
    await monitor.check()
    const safety = await flowSafety(world.database.pool, load, startedAt, world.partitions)
    const endMs = Date.now() - startedAt
    const unresolved: Array<string> = []
    for (const answer of safety.slots.wrong)
      monitor.add(`wrong answer: ${answer.op} ${answer.user} ${answer.what}: ${answer.status}`, endMs)
    const finalViolations = [
      ...safety.overGrants.map((what) => `over-grant: ${what}`),
      ...safety.database.violations.map((what) => `database: ${what}`),
      ...safety.mismatches.map((what) => `Postgres vs clients: ${what}`),
      ...safety.slots.violations.map((what) => `slots and charges: ${what}`)
    ]
    for (const what of finalViolations) {
      if (what.startsWith("database:") || !aboutUsers(what, load.uncertain)) monitor.add(what, endMs)
      else unresolved.push(what)
    }
    const exits = world.members.flatMap((member) =>
      member.incarnations.flatMap((serve, incarnation) =>
        isRunning(serve) || killed.has(serve)
          ? []
          : [`m${member.index} #${incarnation}: exited (${serve.child.exitCode ?? serve.child.signalCode})`]
      )
    )
    const logs = [
      ...world.members.flatMap((member) =>
        member.incarnations.map((serve, incarnation) => ({
          name: `m${member.index}-${incarnation}`,
          text: serve.output()
        }))
      ),
      ...(world.standby?.serverLogs() ?? [])
    ]
    return {
      seed: options.seed,
      kinds: options.kinds,
      faultsMs: options.faultsMs,
      planned: schedule.length,
      applied: applied.sort((left, right) => left.startedMs - right.startedMs),
      calls: Object.fromEntries([...load.sent].map(([op, times]) => [op, times.length])),
      counts: { ...load.counts, consumes: load.consumes.size, commits: load.acknowledged.commits.size },
      failedCalls: load.failures.length,
      uncertainUsers: load.uncertain.size,
      violations: monitor.violations,
      unresolved,
      exits,
      balancedAfterHealMs,
      wallMs: Date.now() - wallStarted,
      logs
    }
  } finally {
    // A run that threw: its workers stopped (bounded), then everything it started.
    if (running !== undefined) await Promise.race([running.stop().catch(() => undefined), sleep(10_000)])
    await closeWorld(world)
  }
}
