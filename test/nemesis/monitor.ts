/**
 * What the nemesis watches while the faults run, once a second: every reply the model can judge yet
 * (judge.ts), processes that exit on their own, calls that never resolve, writes the ledger refused as
 * applied already (memory behind the database), and every five seconds the database (checkDatabase).
 * Each violation is recorded once, with when it was seen.
 */
import { partitionOf } from "../../src/domain/partition.js"
import type { ServeProcess } from "../support/processes.js"
import { checkDatabase } from "../support/databaseChecks.js"
import { withoutDecisions } from "../cluster/cluster.js"
import type { Call } from "./history.js"
import { judgeCall, readyToJudge, userView } from "./judge.js"
import type { NemesisLoad } from "./load.js"
import type { ModelSettings } from "./model.js"
import type { NemesisWorld } from "./world.js"
import { isRunning } from "./world.js"

export interface Violation {
  /** ms from the start of the faults when it was seen; the final checks count from then too. */
  readonly atMs: number
  readonly what: string
}

export class Monitor {
  readonly violations: Array<Violation> = []
  /** Replies judged against the model, and how many were wrong. */
  readonly judged = { replies: 0, wrong: 0 }
  private readonly seen = new Set<string>()
  private readonly judgedCalls = new Set<Call>()
  private lastDatabaseCheck = 0
  private failuresSeen = 0

  constructor(
    private readonly world: NemesisWorld,
    private readonly load: NemesisLoad,
    private readonly model: ModelSettings,
    /** Real ms (Date.now) of the faults' start: every `atMs` counts from it. */
    private readonly startedAt: number,
    /** Processes ended by the nemesis's kill: every other exit is a violation. */
    private readonly killed: ReadonlySet<ServeProcess>,
    private readonly log: (line: string) => void
  ) {}

  add(what: string, atMs = Date.now() - this.startedAt): void {
    if (this.seen.has(what)) return
    this.seen.add(what)
    this.violations.push({ atMs, what })
    this.log(`+${atMs} ms VIOLATION ${what}`)
  }

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

  /** Every call that failed (the SDK's retries exhausted): it never resolved. */
  checkFailures(): void {
    for (const failure of this.load.failures.slice(this.failuresSeen)) {
      const partition = partitionOf(failure.user, this.world.partitions)
      const sent = failure.sentAt === undefined ? "" : ` sent at +${failure.sentAt - this.startedAt} ms,`
      this.add(
        `call never resolved: ${failure.op} ${failure.user} (partition ${partition})${sent} ` +
          `failed at +${failure.at - this.startedAt} ms: ${failure.what}`,
        failure.at - this.startedAt
      )
    }
    this.failuresSeen = this.load.failures.length
  }

  /** Every reply whose user's calls before it have all answered, judged against the model once. */
  judgeReplies(all = false): void {
    for (const [user, calls] of this.load.callsByUser) {
      const ready = calls.filter(
        (call) =>
          !this.judgedCalls.has(call) && call.reply !== undefined && (all || readyToJudge(call, calls))
      )
      if (ready.length === 0) continue
      const view = userView(calls, this.model)
      for (const call of ready) {
        this.judgedCalls.add(call)
        this.judged.replies += 1
        const problems = judgeCall(call, view)
        if (problems.length === 0) continue
        this.judged.wrong += 1
        const atMs = (call.repliedAt ?? call.sentAt) - this.world.worldOffsetMs - this.startedAt
        const partition = partitionOf(user, this.world.partitions)
        this.add(
          `wrong answer: ${call.op} ${user} (partition ${partition})${call.flow === "" ? "" : ` ${call.flow}`} ` +
            `sent +${call.sentAt - this.world.worldOffsetMs - this.startedAt} ms, answered +${atMs} ms ` +
            `${call.reply!.status}: ${problems.join("; ")}`,
          atMs
        )
      }
    }
  }

  async check(): Promise<void> {
    this.checkExits()
    this.checkFailures()
    this.judgeReplies()
    if (Date.now() - this.lastDatabaseCheck >= 5_000) {
      this.lastDatabaseCheck = Date.now()
      const report = await checkDatabase(this.world.database.pool, this.load.snapshot())
      for (const violation of report.violations) this.add(`database: ${violation}`)
    }
  }
}
