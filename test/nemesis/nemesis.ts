/**
 * One run of the nemesis: a world (world.ts), the load (load.ts), faults drawn from a seed
 * (schedule.ts, faults.ts, clusterFaults.ts) applied at their moments and overlapping, and the checks:
 *
 * - while the faults run, once a second (monitor.ts): every reply the model can judge yet against the
 *   per-user model (judge.ts: statuses, expiry on the clocks' bound, used, reserved, pending holds,
 *   slots, the period, reads and refusals included), processes that exit on their own, calls that
 *   never resolve, writes the ledger refused as applied already; every five seconds the database;
 * - once every fault healed, every call resolved and everything due expired: Postgres against the
 *   clients (finalChecks.ts), the events stream against Postgres (eventChecks.ts), answers from stale
 *   memory in every process's log (staleAnswers.ts), and unserved time per partition against its bound
 *   (unserved.ts).
 *
 * A process that exits other than by the nemesis's kill, and an SDK call that never resolves (it failed
 * with the SDK's retries exhausted, or was still in flight 80 s after the load was told to stop), are
 * violations too, though not of the invariant.
 */
import type { ServeProcess } from "../support/processes.js"
import { sleep, waitForBalance } from "../cluster/cluster.js"
import { slotLimit } from "../cluster/flows.js"
import { partitionOf } from "../../src/domain/partition.js"
import { checkEvents } from "./eventChecks.js"
import { describeCall, evidenceOf, usersNamed } from "./history.js"
import { applyFault, healAll } from "./faults.js"
import { finalChecks, waitForExpiries } from "./finalChecks.js"
import { NemesisLoad } from "./load.js"
import type { ModelSettings } from "./model.js"
import type { Violation } from "./monitor.js"
import { Monitor } from "./monitor.js"
import type { FaultEvent, FaultKind } from "./schedule.js"
import { kindsOnOwnPostgres, makeSchedule } from "./schedule.js"
import { processFaultSpans, staleAnswers, watchOwnership } from "./staleAnswers.js"
import type { UnservedReport } from "./unserved.js"
import { judgeUnserved, watchUnserved } from "./unserved.js"
import type { NemesisWorld } from "./world.js"
import {
  closeWorld,
  currentServe,
  faketimeAvailable,
  monthEndOf,
  openWorld,
  ownerOfServe,
  worldNow
} from "./world.js"

export type { Violation } from "./monitor.js"

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
  /** The processes' QUOTA_CLOCK_OFFSET_MAX_MS (B). */
  readonly clockOffsetMaxMs?: number
  readonly workers?: number
  readonly intensity?: number
  /** Half the load's flows time-driven (1-3 s holds and leases); true by default. */
  readonly timed?: boolean
  /**
   * Every clock (processes and Postgres) set so that a month ends in the middle of the faults; by default
   * whenever the run has a Postgres of its own (libfaketime needed).
   */
  readonly monthEnd?: boolean
  /** Stop applying faults at the first violation (the run still heals and checks). */
  readonly stopOnViolation?: boolean
  /** Every call of the load in the result (`calls`), not only the violations' users'. */
  readonly keepCalls?: boolean
  readonly log?: (line: string) => void
}

export interface AppliedFault extends FaultEvent {
  readonly startedMs: number
  readonly endedMs: number
  /** For a fault that took a shared server away: when it answered again (ms from the faults' start). */
  readonly backMs?: number
  readonly what: string
}

export interface NemesisResult {
  readonly seed: number
  readonly kinds: ReadonlyArray<FaultKind>
  readonly faultsMs: number
  readonly planned: number
  readonly applied: ReadonlyArray<AppliedFault>
  readonly calls: Record<string, number>
  readonly counts: NemesisLoad["counts"] & { consumes: number; commits: number }
  readonly failedCalls: number
  readonly uncertainUsers: number
  readonly violations: ReadonlyArray<Violation>
  /** Processes that ended other than by the nemesis's kill. */
  readonly exits: ReadonlyArray<string>
  readonly balancedAfterHealMs: number | undefined
  /** The world: its own Postgres pair or the shared server; the month's end it crossed, from the faults' start. */
  readonly world: {
    readonly ownPostgres: boolean
    readonly monthEndMs: number | undefined
    readonly timed: boolean
  }
  /** Replies judged against the model, and how many were wrong. */
  readonly judged: { readonly replies: number; readonly wrong: number }
  readonly events:
    Pick<Awaited<ReturnType<typeof checkEvents>>, "messages" | "byKind" | "claimsInStream"> | undefined
  readonly unserved: Omit<UnservedReport, "violations"> | undefined
  readonly staleAnswers: number
  readonly wallMs: number
  /** The calls of the users the violations name (at most 12 users), as describeCall shows them. */
  readonly histories: Record<string, ReadonlyArray<string>>
  /** With keepCalls: every call of the load, by user, as describeCall shows them. */
  readonly everyCall?: Record<string, ReadonlyArray<string>>
  /** Every process's whole log (decision lines included), for a failure's evidence. */
  readonly logs: ReadonlyArray<{ readonly name: string; readonly text: string }>
}

const defaults = {
  members: 3,
  partitions: 16,
  leaseMs: 6_000,
  queryTimeoutMs: 1_000,
  clockOffsetMaxMs: 500,
  workers: 24
}

/**
 * The load's SDK retries: enough to outlast any run's faults (1 000 attempts at most 250 ms apart: at
 * least ~4 min even when every attempt fails at once), so that "never resolved" means not answered
 * once everything healed, not "a partition's owner was faulted longer than 60 attempts take".
 */
const loadRetry = { attemptsMax: 1_000, delayMsMax: 250 }

/**
 * How long the load may take to stop once every fault healed: a call still in flight then never
 * resolved (its partition is answered again within seconds of the heal when all is well).
 */
const loadStopMsMax = 80_000

/** Roughly how long a world takes to start (a Postgres pair, three processes, the load's limits). */
const worldStartMs = 12_000

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
    clockOffsetMaxMs: settings.clockOffsetMaxMs,
    leaseMs: settings.leaseMs,
    // One process alone may be cut off too (else a run of one would never apply a disrupting fault).
    disruptedMax: Math.max(1, settings.members - 1),
    ...(options.intensity === undefined ? {} : { intensity: options.intensity })
  })
  const ownPostgres = options.kinds.some((kind) => kindsOnOwnPostgres.has(kind)) || options.monthEnd === true
  const monthEnd =
    (options.monthEnd ?? ownPostgres) && ownPostgres && faketimeAvailable()
      ? monthEndOf(options.seed)
      : undefined
  const timed = options.timed ?? true
  log(
    `nemesis seed ${options.seed}: ${schedule.length} faults (${options.kinds.join(", ")}) over ` +
      `${options.faultsMs} ms; ${timed ? "time-driven load" : "load of long holds and leases"}` +
      `${monthEnd === undefined ? "" : `, crossing ${new Date(monthEnd.at).toISOString()}`}; ` +
      `replay with QUOTA_NEMESIS_SEED=${options.seed}`
  )
  let world: NemesisWorld | undefined
  let running: NemesisLoad | undefined
  try {
    world = await openWorld({
      members: settings.members,
      partitions: settings.partitions,
      leaseMs: settings.leaseMs,
      queryTimeoutMs: settings.queryTimeoutMs,
      clockOffsetMaxMs: settings.clockOffsetMaxMs,
      clock: options.clock && options.kinds.some((kind) => kind === "clock" || kind === "clockBeyond"),
      standby: ownPostgres,
      ...(monthEnd === undefined
        ? {}
        : { monthEnd: { at: monthEnd.at, afterMs: worldStartMs + options.faultsMs / 2 } })
    })
    const open = world
    const model: ModelSettings = {
      clockOffsetMaxMs: settings.clockOffsetMaxMs,
      monthEndAt: monthEnd?.at,
      periodBefore: monthEnd?.before,
      slotLimit
    }
    const load = await NemesisLoad.start({
      servers: world.nats.url,
      prefix: world.prefix,
      partitions: world.partitions,
      label: "nem",
      workers: settings.workers,
      // Few hold users, so each reaches its limit within a run: an over-grant needs a user near it.
      holdUsersPerPartition: 1,
      slotUsersPerPartition: 2,
      seed: options.seed,
      retry: loadRetry,
      timed,
      now: () => worldNow(open)
    })
    running = load
    const probes = await watchUnserved(world.nats.url, world.prefix, world.partitions)
    const ownership = watchOwnership(world.database.pool)
    const startedAt = Date.now()
    const monthEndMs = monthEnd === undefined ? undefined : monthEnd.at - worldNow(world)
    // The processes' logs carry their own clocks' ms: this is their +0 of the fault times (world time).
    log(
      `+0 ms faults start at ${startedAt} (${new Date(startedAt).toISOString()}; world ${new Date(worldNow(world)).toISOString()})` +
        (monthEndMs === undefined ? "" : `; the month ends at +${monthEndMs} ms`)
    )
    const killed = new Set<ServeProcess>()
    const monitor = new Monitor(world, load, model, startedAt, killed, log)
    const applied: Array<AppliedFault> = []
    let stopping = false
    const faultsDone = Promise.all(
      schedule.map(async (event) => {
        await sleep(event.at - (Date.now() - startedAt))
        if (stopping) return
        const startedMs = Date.now() - startedAt
        if (event.kind === "kill") killed.add(currentServe(open.members[event.member]!))
        const outcome = await applyFault(open, event).catch((error: unknown) => ({
          what: `${event.kind} m${event.member} failed: ${String(error)}`,
          backAt: undefined
        }))
        const endedMs = Date.now() - startedAt
        applied.push({
          ...event,
          startedMs,
          endedMs,
          ...(outcome.backAt === undefined ? {} : { backMs: outcome.backAt - startedAt }),
          what: outcome.what
        })
        log(`+${startedMs} ms ${outcome.what}`)
      })
    )
    let faultsOver = false
    void faultsDone.then(() => {
      faultsOver = true
    })
    // The whole window runs, faults or none: the load meets the month's end and the expiries in it.
    while (!faultsOver || Date.now() - startedAt < options.faultsMs) {
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
          `+${call.sentAt - world.worldOffsetMs - startedAt} ms, still in flight ${loadStopMsMax} ms after the load was told to stop`
      )
    }
    const loadStoppedMs = Date.now() - startedAt
    const oks = await probes.stop()
    const ownershipSamples = await ownership.stop()
    await monitor.check()
    monitor.judgeReplies(true)
    const unserved = judgeUnserved(
      oks,
      startedAt,
      { fromMs: 0, toMs: loadStoppedMs },
      applied.map((fault) => ({ ...fault })),
      settings.leaseMs
    )
    for (const what of unserved.violations) monitor.add(`unserved: ${what}`, loadStoppedMs)
    await waitForExpiries(world)
    const endMs = Date.now() - startedAt
    const final = await finalChecks(world.database.pool, load, model, worldNow(world))
    for (const what of [...final.violations, ...final.wrong.map((what) => `wrong answer: ${what}`)])
      monitor.add(what, endMs)
    const events = await checkEvents(world, load).catch((error: unknown) => {
      monitor.add(`events: the stream could not be read: ${String(error)}`, endMs)
      return undefined
    })
    for (const what of events?.violations ?? []) monitor.add(what, endMs)
    const { pauses, clocks } = processFaultSpans(applied, startedAt + open.worldOffsetMs)
    const stale = staleAnswers(world, ownershipSamples, pauses, clocks, startedAt)
    for (const example of stale.examples) monitor.add(`stale answer: ${example}`, endMs)
    const exits = world.members.flatMap((member) =>
      member.incarnations.flatMap((serve, incarnation) =>
        serve.child.exitCode === null && serve.child.signalCode === null
          ? []
          : killed.has(serve)
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
      ...(world.standby?.serverLogs() ?? []),
      ...world.nats.outputs()
    ]
    const { longestSingle, longestOverlapping, boundMs } = unserved
    return {
      seed: options.seed,
      kinds: options.kinds,
      faultsMs: options.faultsMs,
      planned: schedule.length,
      applied: applied.sort((left, right) => left.startedMs - right.startedMs),
      calls: load.sentCounts(),
      counts: {
        ...load.counts,
        consumes: load.calls.filter(
          (call) => call.op === "consume" && ["consumed", "exists"].includes(call.reply?.status ?? "")
        ).length,
        commits: load.acknowledged.commits.size
      },
      failedCalls: load.failures.length,
      uncertainUsers: load.uncertain.size,
      violations: monitor.violations,
      exits,
      balancedAfterHealMs,
      world: { ownPostgres, monthEndMs, timed },
      judged: monitor.judged,
      events:
        events === undefined
          ? undefined
          : {
              messages: events.messages,
              byKind: events.byKind,
              claimsInStream: events.claimsInStream
            },
      unserved: { boundMs, longestSingle, longestOverlapping },
      staleAnswers: stale.count,
      wallMs: Date.now() - wallStarted,
      histories: Object.fromEntries(
        usersNamed(monitor.violations.map((violation) => violation.what).join("\n"), "nem")
          .slice(0, 12)
          .map((user) => [
            user,
            evidenceOf(
              load.callsByUser.get(user) ?? [],
              user,
              monitor.violations.map((violation) => violation.what)
            ).map((call) => describeCall(call, startedAt + open.worldOffsetMs))
          ])
      ),
      ...(options.keepCalls === true
        ? {
            everyCall: Object.fromEntries(
              [...load.callsByUser].map(([user, calls]) => [
                user,
                calls.map((call) => describeCall(call, startedAt + open.worldOffsetMs))
              ])
            )
          }
        : {}),
      logs
    }
  } finally {
    // A run that threw: its workers stopped (bounded), then everything it started.
    if (running !== undefined) await Promise.race([running.stop().catch(() => undefined), sleep(10_000)])
    await closeWorld(world)
  }
}
