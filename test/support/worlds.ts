/**
 * The auditor of the lifecycle property: the model's possible worlds, checked against every reply.
 *
 * Without faults there is one world and every reply must be exactly what it predicts. A crash makes
 * outcomes uncertain, as TigerBeetle's auditor tracks: a command answered `unavailable` may or may not
 * have been applied. The auditor then keeps every world that is consistent with what was observed
 * (for each user, some prefix of the commands in flight applied, the rest not), and later replies
 * prune the worlds that predicted otherwise. No world left means a reply no sound execution explains.
 *
 * A write whose outcome is unknown (no crash: the COMMIT got no answer, and the server commits it later
 * or never) fails one actor's group: that group, and every waiter the actor had parked, is answered
 * `unavailable`, the actor reloads once the write is settled, and decides the user's later commands
 * definitively. The test knows each such write's user and whether it was applied, not which commands
 * it held: the auditor keeps every world in which some run of that user's `unavailable` commands was
 * the group, applied or not as the write was.
 *
 * A clock that steps back: timestamps (expiry, leases, waits) are taken from the clock as it reads,
 * nothing falls due or un-expires on the way back, and a period never goes back (model.ts, usageNow).
 */
import type { Command } from "../../src/domain/commands.js"
import type { Config } from "../../src/domain/config.js"
import type { Result } from "../../src/domain/results.js"
import type { Fired } from "./harness.js"
import { flushTurns, settledWithin } from "./harness.js"
import type { ModelState, ModelUser, Wake } from "./model.js"
import {
  matchesPrediction,
  modelAdvanceTo,
  modelCrash,
  modelNextDeadline,
  modelSetClock,
  modelStep,
  normalizeActual
} from "./model.js"

/** What a real system must offer the auditor. */
export interface AuditedSystem {
  readonly fire: (command: Command) => Fired
  /** Moves the clock by ms (TestClock.adjust). */
  readonly advance: (ms: number) => Promise<void>
  /** A crash: fence the store, then drop every actor. */
  readonly crash: () => Promise<void>
  /** Runs the orphan sweep once. */
  readonly sweep: () => Promise<void>
  /** Durable rows still due at `now` (a pending hold past expiresAt, a lease past its end): after a sweep, none. */
  readonly dueRows: (now: number) => Array<string>
  /** Sets the clock to `at`, earlier than now (TestClock.setTime). */
  readonly setClock: (at: number) => Promise<void>
  /** The next writes (any user's), one per entry, fail with an unknown outcome: applied later or not, as given. */
  readonly armUnknownOutcomes: (applied: ReadonlyArray<boolean>) => void
  /**
   * Settles (applies or drops) the armed writes taken since the last call and tells whose they were;
   * with `disarm`, the armed ones not taken are forgotten.
   */
  readonly releaseUnknownOutcomes: (disarm: boolean) => Array<UnknownOutcome>
}

/** A write that failed with an unknown outcome: one group of `user`'s, applied later or dropped. */
export interface UnknownOutcome {
  readonly user: string
  readonly applied: boolean
}

interface Caller {
  readonly caller: number
  readonly command: Command
  readonly fired: Fired
}

/** Per caller: the reply a world predicts, or "waits" (not answered yet). */
type Predictions = Map<number, Result | "waits">

/** Worlds beyond this mean the auditor cannot tell outcomes apart any more: the run fails rather than crawl. */
const worldsMax = 4_096

/** Turns to let a reply that only some worlds predict arrive, before observing it as still waiting. */
const undecidedTurns = 100

/** PROTOCOL.md: what a command whose outcome the coordinator cannot vouch for is answered. */
const unavailable: Result = { status: "unavailable" }

/** `overloaded` while enqueueing: nothing was enqueued, so no world applies it. */
const isRefused = (reply: Fired): boolean => reply.atOnce?.status === "overloaded"

const jobOf = (command: Command): string | undefined => ("job" in command ? command.job : undefined)

export const show = (command: Command): string => JSON.stringify(command)

export class Auditor {
  worlds: Array<ModelState>
  /** acquire_slot callers some world says are still waiting. */
  readonly outstanding = new Map<number, Caller>()
  private nextCaller = 0
  /** Every command and its reply, in order, for the failure message. */
  readonly log: Array<string> = []

  constructor(
    readonly config: Config,
    readonly users: ReadonlyArray<string>,
    start: ModelState
  ) {
    this.worlds = [start]
  }

  get now(): number {
    return this.worlds[0]!.now
  }

  /**
   * Fires commands in order without awaiting, then checks every reply (and every waiter answered on
   * the way) against each world. `before` runs on each world first (a time step) and its wakes count.
   */
  async exchange(
    real: AuditedSystem,
    commands: ReadonlyArray<Command>,
    before?: (world: ModelState) => Array<Wake>
  ): Promise<void> {
    const fired: Array<Caller> = commands.map((command) => ({
      caller: this.nextCaller++,
      command,
      fired: real.fire(command)
    }))
    const predictions = this.worlds.map((world): Predictions => {
      const predicted: Predictions = new Map()
      for (const caller of this.outstanding.keys()) predicted.set(caller, "waits")
      const wake = (wakes: ReadonlyArray<Wake>): void => {
        for (const { caller, result } of wakes) predicted.set(caller, result)
      }
      if (before !== undefined) wake(before(world))
      for (const { caller, command, fired: reply } of fired) {
        if (isRefused(reply)) {
          predicted.set(caller, reply.atOnce!)
          continue
        }
        const outcome = modelStep(this.config, world, command, caller)
        predicted.set(caller, outcome.result)
        wake(outcome.wakes)
      }
      return predicted
    })
    const callers = [...this.outstanding.values(), ...fired]
    // Wait for the replies every world predicts, then give the undecided ones a chance to arrive.
    const certain = callers.filter(({ caller }) =>
      predictions.every((predicted) => predicted.get(caller) !== "waits")
    )
    // A missing reply shows up below as a mismatch ("no answer").
    await settledWithin(Promise.all(certain.map(({ fired }) => fired.promise)))
    await flushTurns(certain.length === callers.length ? 1 : undecidedTurns)

    const survivors: Array<ModelState> = []
    for (const [index, world] of this.worlds.entries()) {
      if (this.mismatches(callers, predictions[index]!).length === 0) survivors.push(world)
    }
    for (const { caller, command, fired: reply } of callers) {
      this.log.push(`${show(command)} -> ${reply.settled() ? JSON.stringify(reply.value()) : "(waiting)"}`)
      if (reply.settled()) this.outstanding.delete(caller)
    }
    if (survivors.length === 0) this.fail("no world explains these replies", callers, predictions[0]!)
    this.worlds = dedupe(survivors)
    for (const entry of fired) if (!entry.fired.settled()) this.outstanding.set(entry.caller, entry)
  }

  /** Moves the clock by `ms`, stopping at every deadline of any world; at each stop, sweeps and probes every user. */
  async advance(real: AuditedSystem, ms: number): Promise<void> {
    const target = this.now + ms
    while (this.now < target) {
      let next = target
      for (const world of this.worlds) {
        const deadline = modelNextDeadline(world)
        if (deadline !== null && deadline > world.now && deadline < next) next = deadline
      }
      const from = this.now
      await real.advance(next - from)
      // The clock alone must answer the waiters whose wait ran out or who got a freed slot.
      await this.exchange(real, [], (world) => modelAdvanceTo(this.config, world, next))
      await real.sweep()
      const due = real.dueRows(next)
      if (due.length > 0)
        throw new Error(`after the sweep at ${new Date(next).toISOString()}, still due: ${due.join(", ")}`)
      await this.exchange(
        real,
        this.users.map((user): Command => ({ op: "get_usage", user }))
      )
    }
  }

  /**
   * Fires commands, lets `turns` macrotask turns pass, then crashes (fence, drop every actor). Every
   * reply and waiter must settle; a definite one must be what some world predicts, an `unavailable`
   * one is uncertain. Keeps every world in which, per user, a prefix of that user's commands applied.
   */
  async crash(real: AuditedSystem, commands: ReadonlyArray<Command>, turns: number): Promise<void> {
    const fired: Array<Caller> = commands.map((command) => ({
      caller: this.nextCaller++,
      command,
      fired: real.fire(command)
    }))
    await flushTurns(turns)
    await real.crash()
    const callers = [...this.outstanding.values(), ...fired]
    if (!(await settledWithin(Promise.all(callers.map(({ fired: reply }) => reply.promise))))) {
      const open = callers.filter(({ fired: reply }) => !reply.settled()).map(({ command }) => show(command))
      throw new Error(`after a crash, every reply and waiter must settle; no answer to: ${open.join(", ")}`)
    }
    const observed = new Map(callers.map(({ caller, fired: reply }) => [caller, reply.value()!]))
    for (const { command, fired: reply } of callers)
      this.log.push(`(crash) ${show(command)} -> ${JSON.stringify(reply.value())}`)

    const byUser = new Map<string, Array<Caller>>()
    for (const entry of fired) {
      const list = byUser.get(entry.command.user) ?? []
      list.push(entry)
      byUser.set(entry.command.user, list)
    }
    const users = [...byUser.keys()]
    const survivors: Array<ModelState> = []
    let firstFailure: { predicted: Predictions } | undefined
    for (const world of this.worlds) {
      for (const prefix of prefixes(users.map((user) => byUser.get(user)!.length))) {
        const candidate = structuredClone(world)
        const predicted: Predictions = new Map()
        for (const caller of this.outstanding.keys()) predicted.set(caller, "waits")
        let consistent = true
        for (const [userIndex, user] of users.entries()) {
          for (const [index, { caller, command, fired: reply }] of byUser.get(user)!.entries()) {
            if (isRefused(reply)) {
              predicted.set(caller, reply.atOnce!)
              continue
            }
            if (index >= prefix[userIndex]!) {
              // Not applied: it cannot have a definite answer.
              if (observed.get(caller)!.status !== "unavailable") consistent = false
              continue
            }
            const outcome = modelStep(this.config, candidate, command, caller)
            predicted.set(caller, outcome.result)
            for (const wake of outcome.wakes) predicted.set(wake.caller, wake.result)
          }
        }
        // Whoever still waits at the crash lost its place: its answer is `unavailable`.
        modelCrash(candidate)
        for (const { caller, command } of callers) {
          const actual = observed.get(caller)!
          if (actual.status === "unavailable") continue
          const expected = predicted.get(caller)
          if (expected === undefined || expected === "waits" || !this.matches(expected, actual, command)) {
            consistent = false
          }
        }
        if (consistent) survivors.push(candidate)
        else firstFailure ??= { predicted }
      }
    }
    this.outstanding.clear()
    if (survivors.length === 0)
      this.fail("no world explains the replies around a crash", callers, firstFailure!.predicted)
    this.worlds = dedupe(survivors)
    if (this.worlds.length > worldsMax)
      throw new Error(`${this.worlds.length} possible worlds: too many to audit`)
  }

  /**
   * The clock steps back `ms`: nothing is decided on the way. Then every user is read at once: what they
   * report (each meter's period and usage included) must not go back with the clock.
   */
  async stepBack(real: AuditedSystem, ms: number): Promise<void> {
    const to = this.now - ms
    await real.setClock(to)
    for (const world of this.worlds) modelSetClock(world, to)
    await this.exchange(
      real,
      this.users.map((user): Command => ({ op: "get_usage", user }))
    )
  }

  /**
   * Fires commands with the next writes armed to fail with an unknown outcome (`applied`: whether each
   * lands later), lets `turns` macrotask turns pass before settling those taken (once per armed write,
   * so a user reloaded after one may fail the next), then checks every reply. Per user, the k writes
   * of that user that failed were k runs of its `unavailable` commands, in order: the auditor keeps
   * every world in which some such runs were the failed groups (applied or dropped as their writes
   * were), the user's waiters at each failure left the queue (answered `unavailable`), and everything
   * else is answered as that world predicts.
   */
  async unknownOutcome(
    real: AuditedSystem,
    commands: ReadonlyArray<Command>,
    applied: ReadonlyArray<boolean>,
    turns: number
  ): Promise<void> {
    real.armUnknownOutcomes(applied)
    const fired: Array<Caller> = commands.map((command) => ({
      caller: this.nextCaller++,
      command,
      fired: real.fire(command)
    }))
    const failed: Array<UnknownOutcome> = []
    for (let round = 0; round < applied.length; round += 1) {
      await flushTurns(turns)
      failed.push(...real.releaseUnknownOutcomes(round === applied.length - 1))
    }
    // Every reply but a waiting acquire_slot comes once the reloads have read the settled rows.
    await settledWithin(
      Promise.all(
        fired.filter(({ command }) => command.op !== "acquire_slot").map(({ fired: reply }) => reply.promise)
      )
    )
    const callers = [...this.outstanding.values(), ...fired]
    // A waiting acquire_slot of a user that was sent something may still be answered (a release's
    // wakeup, a reload's `unavailable`): give it time to arrive. Nothing else can answer a waiter now.
    const touched = new Set([...fired.map(({ command }) => command.user), ...failed.map(({ user }) => user)])
    const undecided = callers.some(
      ({ command, fired: reply }) => !reply.settled() && touched.has(command.user)
    )
    await flushTurns(undecided ? undecidedTurns : 1)
    for (const { command, fired: reply } of callers)
      this.log.push(
        `(unknown outcome) ${show(command)} -> ${reply.settled() ? JSON.stringify(reply.value()) : "(waiting)"}`
      )
    this.log.push(
      `(unknown outcome) writes: ${failed.map(({ user, applied: landed }) => `${user} ${landed ? "applied" : "dropped"}`).join(", ") || "none taken"}`
    )

    const byUser = new Map<string, Array<Caller>>()
    for (const entry of fired) {
      if (isRefused(entry.fired)) continue
      const list = byUser.get(entry.command.user) ?? []
      list.push(entry)
      byUser.set(entry.command.user, list)
    }
    const outcomesOf = new Map<string, Array<boolean>>()
    for (const { user, applied: landed } of failed)
      outcomesOf.set(user, [...(outcomesOf.get(user) ?? []), landed])
    const isUnavailable = ({ fired: reply }: Caller): boolean => reply.value()?.status === "unavailable"
    const users = [...new Set([...byUser.keys(), ...outcomesOf.keys()])]
    const placements = users.map((user) =>
      groupPlacements((byUser.get(user) ?? []).map(isUnavailable), outcomesOf.get(user) ?? [])
    )

    const survivors: Array<ModelState> = []
    let firstFailure: Predictions | undefined
    for (const world of this.worlds) {
      for (const placement of product(placements)) {
        const candidate = structuredClone(world)
        const predicted: Predictions = new Map()
        for (const caller of this.outstanding.keys()) predicted.set(caller, "waits")
        for (const { caller, fired: reply } of fired)
          if (isRefused(reply)) predicted.set(caller, reply.atOnce!)
        /** Callers a failed group answered `unavailable`: its own, those it woke, the user's waiters. */
        const failedCallers = new Set<number>()
        for (const [userIndex, user] of users.entries()) {
          const groups = placement[userIndex]!
          let before: ModelUser | undefined
          for (const [index, { caller, command }] of (byUser.get(user) ?? []).entries()) {
            const group = groups.find(({ start, end }) => index >= start && index < end)
            if (group?.start === index) before = structuredClone(candidate.users[user])
            const outcome = modelStep(this.config, candidate, command, caller)
            if (group === undefined) {
              predicted.set(caller, outcome.result)
              for (const wake of outcome.wakes) predicted.set(wake.caller, wake.result)
              continue
            }
            failedCallers.add(caller)
            for (const wake of outcome.wakes) failedCallers.add(wake.caller)
            if (index !== group.end - 1) continue
            if (!group.applied) {
              if (before === undefined) delete candidate.users[user]
              else candidate.users[user] = before
            }
            // The actor reloads: the waiting queue was memory only.
            for (const waiter of candidate.users[user]?.waiters.splice(0) ?? [])
              for (const waiting of waiter.callers) failedCallers.add(waiting)
          }
        }
        let consistent = true
        for (const { caller, command, fired: reply } of callers) {
          const expected = failedCallers.has(caller) ? unavailable : predicted.get(caller)
          if (expected === undefined) continue
          if (
            expected === "waits"
              ? reply.settled()
              : !reply.settled() || !this.matches(expected, reply.value()!, command)
          )
            consistent = false
        }
        if (consistent) survivors.push(candidate)
        else {
          if (firstFailure === undefined) {
            firstFailure = new Map(predicted)
            for (const caller of failedCallers) firstFailure.set(caller, unavailable)
          }
        }
      }
    }
    for (const { caller, fired: reply } of callers) if (reply.settled()) this.outstanding.delete(caller)
    if (survivors.length === 0)
      this.fail(
        `no world explains the replies around ${failed.length} write(s) of unknown outcome`,
        callers,
        firstFailure ?? new Map()
      )
    this.worlds = dedupe(survivors)
    for (const entry of fired) if (!entry.fired.settled()) this.outstanding.set(entry.caller, entry)
    if (this.worlds.length > worldsMax)
      throw new Error(`${this.worlds.length} possible worlds: too many to audit`)
  }

  private matches(predicted: Result, actual: Result, command: Command): boolean {
    const normalized = normalizeActual(actual, jobOf(command))
    return typeof normalized !== "string" && matchesPrediction(this.config, predicted, normalized)
  }

  private mismatches(callers: ReadonlyArray<Caller>, predicted: Predictions): Array<string> {
    const problems: Array<string> = []
    for (const { caller, command, fired } of callers) {
      const expected = predicted.get(caller)
      if (expected === undefined) continue
      if (!fired.settled()) {
        if (expected !== "waits")
          problems.push(
            `${show(command)}\n      model:  ${JSON.stringify(expected)}\n      actual: (no answer)`
          )
        continue
      }
      const actual = fired.value()!
      if (expected === "waits" || !this.matches(expected, actual, command)) {
        const normalized = normalizeActual(actual, jobOf(command))
        problems.push(
          `${show(command)}\n      model:  ${expected === "waits" ? "(still waiting)" : JSON.stringify(expected)}\n      actual: ${typeof normalized === "string" ? normalized : JSON.stringify(normalized)}`
        )
      }
    }
    return problems
  }

  private fail(what: string, callers: ReadonlyArray<Caller>, predicted: Predictions): never {
    const problems = this.mismatches(callers, predicted)
    throw new Error(
      `${what} (${this.worlds.length} world(s) before; first world's view):\n    ${problems.join("\n    ")}\n` +
        `  last replies:\n    ${this.log.slice(-12).join("\n    ")}`
    )
  }
}

/** A run of one user's commands (indexes start..end-1) that was one failed group, applied or not. */
interface FailedGroup {
  readonly start: number
  readonly end: number
  readonly applied: boolean
}

/**
 * Every way to place `outcomes.length` failed groups, in order, on disjoint runs of the commands answered
 * `unavailable` (by index), each run of length 1 or more.
 */
const groupPlacements = (
  unavailable: ReadonlyArray<boolean>,
  outcomes: ReadonlyArray<boolean>,
  from = 0
): Array<Array<FailedGroup>> => {
  if (outcomes.length === 0) return [[]]
  const [applied, ...rest] = outcomes as [boolean, ...Array<boolean>]
  const placements: Array<Array<FailedGroup>> = []
  for (let start = from; start < unavailable.length; start += 1) {
    for (let end = start + 1; end <= unavailable.length && unavailable[end - 1] === true; end += 1) {
      for (const tail of groupPlacements(unavailable, rest, end))
        placements.push([{ start, end, applied }, ...tail])
    }
  }
  return placements
}

/** Every combination of one choice per list. */
const product = <A>(lists: ReadonlyArray<ReadonlyArray<A>>): Array<Array<A>> => {
  let combinations: Array<Array<A>> = [[]]
  for (const list of lists)
    combinations = combinations.flatMap((combination) => list.map((choice) => [...combination, choice]))
  return combinations
}

/** Every combination of prefix lengths 0..lengths[i] per user. */
const prefixes = (lengths: ReadonlyArray<number>): Array<Array<number>> => {
  let combinations: Array<Array<number>> = [[]]
  for (const length of lengths) {
    const next: Array<Array<number>> = []
    for (const combination of combinations) {
      for (let count = 0; count <= length; count += 1) next.push([...combination, count])
    }
    combinations = next
  }
  return combinations
}

const dedupe = (worlds: ReadonlyArray<ModelState>): Array<ModelState> => {
  const seen = new Set<string>()
  const unique: Array<ModelState> = []
  for (const world of worlds) {
    const key = JSON.stringify(world)
    if (seen.has(key)) continue
    seen.add(key)
    unique.push(world)
  }
  return unique
}
