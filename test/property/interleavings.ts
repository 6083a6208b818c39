/**
 * The interleaving property, shared by the real Coordinator's test and the naive variant that must fail.
 *
 * A run: set each user's plan and limits one command at a time; then rounds of concurrent commands,
 * all fired without awaiting, while fc.scheduler decides the order in which every store write (and
 * every load) completes; between rounds, the clock moves. After the run the auditor checks the replies
 * (grants within limits, every id and key acknowledged at most once) and the durable rows (nothing
 * charged twice, totals equal the ledger, meters without overage sources within their limits).
 *
 * For the real Coordinator, which decides each user's commands in the order they were enqueued, the
 * independent model also predicts every reply exactly, and the durable rows at the end.
 */
import fc from "fast-check"
import type { Command } from "../../src/domain/commands.js"
import type { Config } from "../../src/domain/config.js"
import type { Result } from "../../src/domain/results.js"
import type { MemoryStore } from "../../src/store/MemoryStore.js"
import type { Exchange } from "../support/audit.js"
import { auditReplies, auditStore, taintedBy } from "../support/audit.js"
import type { Fired } from "../support/harness.js"
import { flushTurns, within } from "../support/harness.js"
import type { ModelState, Wake } from "../support/model.js"
import {
  initialModel,
  matchesPrediction,
  modelAdvanceTo,
  modelExpectedRows,
  modelNextDeadline,
  modelStep,
  normalizeActual,
  periodStartOf
} from "../support/model.js"
import { propertyUsers, showCommand } from "./arbitraries.js"

export interface RunningSystem {
  readonly store: MemoryStore
  readonly fire: (command: Command) => Fired
  /** Moves the clock by ms (only systems with `exact`). */
  readonly advance: (ms: number) => Promise<void>
  /** What went wrong inside (a failed write, a crashed decision): in a run without faults, nothing. */
  readonly errors: () => ReadonlyArray<string>
  readonly close: () => Promise<void>
}

export interface SystemUnderTest {
  readonly name: string
  readonly config: Config
  /** Whether the model predicts every reply exactly (the real Coordinator); otherwise only the audit runs. */
  readonly exact: boolean
  /** Whether `overloaded` is a legitimate answer (a cap on resident actors). */
  readonly mayRefuse?: boolean
  readonly start: (scheduler: fc.Scheduler, startAt: number) => Promise<RunningSystem>
}

export interface Round {
  readonly commands: ReadonlyArray<Command>
  /** How far the clock moves after the round settles. */
  readonly advanceMs: number
}

export interface InterleavingInput {
  readonly setup: ReadonlyArray<Command>
  readonly rounds: ReadonlyArray<Round>
  readonly scheduler: fc.Scheduler
}

/** 2026-01-31T23:58:00Z: two minutes before a month boundary, so a run's clock may cross into February. */
export const interleavingStartAt = Date.UTC(2026, 0, 31, 23, 58)

/** Real milliseconds a settle may take before the run fails as hung. */
const settleMs = 10_000

/** Macrotask turns with nothing scheduled and the promise unsettled before a settle gives up: "stuck". */
const idleTurnsMax = 100

/**
 * What `s.waitFor(promise)` does, but failing fast when nothing is left to release and the promise still
 * has not settled (a reply the model expects that never comes would otherwise hang until a timeout).
 * Before each release it lets Effect's fibers run a turn, so more writes are pending to choose among.
 */
export const settleOrStuck = async <A>(s: fc.Scheduler, promise: Promise<A>, what: string): Promise<A> => {
  let done = false
  promise.then(
    () => (done = true),
    () => (done = true)
  )
  let idleTurns = 0
  while (!done) {
    await flushTurns(1)
    if (done) break
    if (s.count() > 0) {
      idleTurns = 0
      await s.waitOne()
      continue
    }
    idleTurns += 1
    if (idleTurns > idleTurnsMax)
      throw new Error(`stuck: nothing left to schedule and no answer yet: ${what}`)
  }
  return promise
}

export const runInterleaving = async (system: SystemUnderTest, input: InterleavingInput): Promise<void> => {
  const { config } = system
  const s = input.scheduler
  const running = await system.start(s, interleavingStartAt)
  const model: ModelState = initialModel(interleavingStartAt)
  const exchanges: Array<Exchange> = []
  const problems: Array<string> = []
  let nextCaller = 0
  /** acquire_slot callers the model says are waiting, by caller id. */
  const waiting = new Map<number, Fired>()
  const settle = <A>(promise: Promise<A>, what: string): Promise<A> =>
    within(settleOrStuck(s, promise, what), settleMs, what)

  const compare = (
    where: string,
    command: Command,
    predicted: Result,
    actual: Result,
    job?: string
  ): void => {
    exchanges.push({ command, result: actual })
    if (!system.exact) return
    const normalized = normalizeActual(actual, job)
    if (typeof normalized === "string") {
      problems.push(`${where} ${showCommand(command)}: ${normalized}`)
      return
    }
    if (!matchesPrediction(config, predicted, normalized)) {
      problems.push(
        `${where} ${showCommand(command)}\n    model:  ${JSON.stringify(predicted)}\n    actual: ${JSON.stringify(normalized)}`
      )
    }
  }

  /**
   * Fires commands without awaiting any reply, each at a moment the scheduler picks (so firings
   * interleave with the completion of store writes and loads), then settles their replies and the
   * waiters the model says they woke. The model decides each command when it is fired: the order
   * of the user's mailbox.
   */
  const fireAll = async (where: string, commands: ReadonlyArray<Command>): Promise<void> => {
    const immediate: Array<{ command: Command; fired: Fired; predicted: Result }> = []
    const wakes: Array<Wake> = []
    const fireOne = (command: Command): void => {
      const caller = nextCaller++
      const fired = running.fire(command)
      if (fired.atOnce?.status === "overloaded") {
        // Refused at the door (no idle actor to evict): nothing enqueued, nothing for the model to apply.
        immediate.push({ command, fired, predicted: fired.atOnce })
        return
      }
      const outcome = modelStep(config, model, command, caller)
      wakes.push(...outcome.wakes)
      if (outcome.result === "waits") waiting.set(caller, fired)
      else immediate.push({ command, fired, predicted: outcome.result })
    }
    if (commands.length === 1) fireOne(commands[0]!)
    else {
      const firings = commands.map((command) =>
        s.schedule(Promise.resolve(), `fire ${showCommand(command)}`).then(() => fireOne(command))
      )
      await settle(Promise.all(firings), `${where}: firing`)
    }
    await settleWakes(where, wakes, immediate)
  }

  const settleWakes = async (
    where: string,
    wakes: ReadonlyArray<Wake>,
    immediate: ReadonlyArray<{ command: Command; fired: Fired; predicted: Result }> = []
  ): Promise<void> => {
    const woken = wakes.map((wake) => {
      const fired = waiting.get(wake.caller)
      if (fired === undefined) throw new Error(`model woke caller ${wake.caller}, which is not waiting`)
      waiting.delete(wake.caller)
      return { wake, fired }
    })
    await settle(
      Promise.all([
        ...immediate.map((entry) => entry.fired.promise),
        ...woken.map((entry) => entry.fired.promise)
      ]),
      `${where}: replies to ${immediate.map((entry) => showCommand(entry.command)).join(", ")}` +
        ` and waiters ${woken.map((entry) => showCommand(entry.fired.command)).join(", ")}`
    )
    for (const { command, fired, predicted } of immediate) {
      compare(where, command, predicted, fired.value()!, "job" in command ? command.job : undefined)
    }
    for (const { wake, fired } of woken) {
      const command = fired.command
      compare(
        `${where} (woken)`,
        command,
        wake.result,
        fired.value()!,
        "job" in command ? command.job : undefined
      )
    }
    if (system.exact) {
      // A waiter the model says still waits must not have been answered.
      await flushTurns()
      for (const fired of waiting.values()) {
        if (fired.settled()) {
          problems.push(
            `${where}: ${showCommand(fired.command)} answered ${JSON.stringify(fired.value())} while the model says it waits`
          )
        }
      }
    }
  }

  /** Moves the clock to `target`, stopping at every deadline on the way and probing each user there. */
  const stepTo = async (target: number): Promise<void> => {
    while (model.now < target) {
      const next = modelNextDeadline(model)
      const to = next !== null && next > model.now && next < target ? next : target
      const from = model.now
      const wakes = modelAdvanceTo(config, model, to)
      await settle(running.advance(to - from), `advance to ${new Date(to).toISOString()}`)
      // The clock alone must answer the waiters whose wait ran out or who got a freed slot: no command prompts it.
      await settleWakes(`at ${new Date(to).toISOString()}, by the clock alone`, wakes)
      const probes = propertyUsers.map((user) => {
        const command: Command = { op: "get_usage", user }
        const fired = running.fire(command)
        if (fired.atOnce?.status === "overloaded") return { command, fired, predicted: fired.atOnce }
        return { command, fired, predicted: modelStep(config, model, command).result as Result }
      })
      await settleWakes(`at ${new Date(to).toISOString()}`, [], probes)
    }
  }

  try {
    for (const [index, command] of input.setup.entries()) await fireAll(`setup #${index}`, [command])
    // The setup's plans and limits come before any usage: they cannot put a meter over its limit.
    const setupExchanges = exchanges.length
    for (const [index, round] of input.rounds.entries()) {
      await fireAll(`round ${index}`, round.commands)
      // After each settle, the durable rows keep the invariant (not only at the end).
      for (const problem of auditStore(
        config,
        running.store,
        model.now,
        taintedBy(exchanges.slice(setupExchanges))
      )) {
        problems.push(`after round ${index}: ${problem}`)
      }
      if (system.exact && round.advanceMs > 0) await stepTo(model.now + round.advanceMs)
    }
    if (system.exact) {
      // Past every wait (30 s at most): each waiter gets its answer.
      await stepTo(model.now + 31_000)
      if (waiting.size > 0) problems.push(`${waiting.size} acquire_slot callers never answered`)
      // One user at a time, so that each is resident (no `overloaded`) and applies whatever fell due.
      for (const user of propertyUsers) await fireAll(`final ${user}`, [{ op: "get_usage", user }])
      // Durable rows, as the model says they must be.
      for (const user of propertyUsers) {
        const expected = modelExpectedRows(config, model, user)
        const rows = running.store.rows.get(user)
        const actual = {
          plan: rows?.plan ?? null,
          limits: Object.fromEntries(rows?.limits ?? []),
          holds: Object.fromEntries(
            [...(rows?.holds.values() ?? [])].map((hold) => [
              hold.id,
              {
                meter: hold.meter,
                amount: hold.amount,
                consumed: hold.consumed,
                state: hold.state,
                expiresAt: hold.expiresAt
              }
            ])
          ),
          used: Object.fromEntries(
            Object.keys(expected.used).map((meter) => {
              const period = config.meters.find((entry) => entry.name === meter)?.period ?? "none"
              return [meter, rows?.usage.get(`${meter}|${periodStartOf(period, model.now)}`)?.used ?? 0]
            })
          ),
          slots: Object.fromEntries(rows?.slots ?? [])
        }
        if (JSON.stringify(sortKeys(actual)) !== JSON.stringify(sortKeys(expected))) {
          problems.push(
            `${user}: durable rows differ from the model\n    model: ${JSON.stringify(sortKeys(expected))}\n    rows:  ${JSON.stringify(sortKeys(actual))}`
          )
        }
      }
    } else {
      await settle(Promise.resolve(), "drain")
    }
    problems.push(...running.errors().map((error) => `internal error: ${error}`))
    problems.push(...auditReplies(config, exchanges, { overloadedAllowed: system.mayRefuse === true }))
    problems.push(...auditStore(config, running.store, model.now, taintedBy(exchanges.slice(setupExchanges))))
  } finally {
    await running.close()
  }
  if (problems.length > 0) {
    throw new Error(`${system.name}: ${problems.length} problem(s)\n  ${problems.slice(0, 8).join("\n  ")}`)
  }
}

const sortKeys = (value: unknown): unknown => {
  if (Array.isArray(value)) return value.map(sortKeys)
  if (typeof value !== "object" || value === null) return value
  return Object.fromEntries(
    Object.keys(value)
      .sort()
      .map((key) => [key, sortKeys((value as Record<string, unknown>)[key])])
  )
}

/** A short form of a run for the counterexample. */
export const showInput = (input: Omit<InterleavingInput, "scheduler">): string =>
  [
    `setup: ${input.setup.map(showCommand).join("; ")}`,
    ...input.rounds.map(
      (round, index) =>
        `round ${index}: ${round.commands.map(showCommand).join(" | ")}; then +${round.advanceMs} ms`
    )
  ].join("\n")
