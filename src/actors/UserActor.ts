/**
 * One user's actor: the single writer of that user's state. It takes what its mailbox holds, decides
 * each command in order, hands the group's events to the store in one write, and only after the store
 * confirms does it answer. While that write is in flight, new commands queue and are decided as the
 * next group, so a hot user gets many commands per commit, not one per round trip.
 *
 * A failed write or a failed invariant answers the group (and every parked waiter) `unavailable` and
 * reloads the state from the store: memory never runs ahead of what is durable.
 *
 * The actor's fiber runs only while its mailbox has work: the coordinator starts it on the first
 * command that finds the actor idle, and it ends when the mailbox is empty. An idle actor is its state
 * and a few fields, no fiber and no queue object (memory per resident user is what the cap multiplies).
 */
import { Cause, Effect, Exit, Option } from "effect"
import type { Fiber } from "effect"
import type { Command } from "../domain/commands.js"
import type { Config } from "../domain/config.js"
import type { DecideContext, Wakeup } from "../domain/context.js"
import { decideInto } from "../domain/decide.js"
import type { StoreEvent } from "../domain/events.js"
import { assertUserState } from "../domain/invariants.js"
import type { Result } from "../domain/results.js"
import { unavailable } from "../domain/results.js"
import type { UserState } from "../domain/state.js"
import {
  idsToRecall,
  nextDeadline,
  periodFloorToStore,
  planOf,
  rememberRecalled,
  userStateFromStored
} from "../domain/state.js"
import type { MetricsRecorder } from "../ops/MetricsRecorder.js"
import { failedWriteRetryDelayMs, recallIdsMax } from "../domain/limits.js"
import { usageHistoryMeters } from "../domain/usageHistory.js"
import { turnEndsAt } from "./turn.js"
import type { StoreShape, StoreUnavailable } from "../store/Store.js"
import { busyResult } from "../domain/slots.js"
import type { RecencyLinks, RecencyList } from "./RecencyList.js"

/** Called exactly once with the command's result: the actor's only way to answer. */
export type Reply = (result: Result) => void

export interface Envelope {
  /** Replaced once, before its decision, by a `usage_history` carrying the past periods it read. */
  command: Command
  readonly reply: Reply
  /** Set by the first answer: every later one (a parked waiter also in a failed group) is dropped. */
  answered: boolean
}

/** The empty group, shared: an actor with nothing in flight allocates nothing for it. */
const noEnvelopes: ReadonlyArray<Envelope> = Object.freeze([])

export const makeEnvelope = (command: Command, reply: Reply): Envelope => ({
  command,
  reply,
  answered: false
})

export interface ActorSettings {
  readonly config: Config
  readonly store: StoreShape
  /** Effect's clock, read synchronously (tests drive it with TestClock). */
  readonly now: () => number
  readonly random: () => number
  readonly decisionsPerWriteMax: number
  /** Recount every aggregate after each decision (tests). */
  readonly assertFull: boolean
  readonly onError: (user: string, message: string, cause: unknown) => void
  /** Told of each `busy` answered (a snooze), with the user's plan. */
  readonly metrics: MetricsRecorder
  /** Called with each group's events once the store confirmed them (logs of expiries, metrics). */
  readonly onPersisted: (events: ReadonlyArray<StoreEvent>) => void
  /**
   * The epoch under which this process may decide for the user now (scaled out: it holds the partition
   * under that epoch and its lease has not run out locally), or undefined when it may not. An actor
   * records it before it loads and decides only while it is the same, writing under it: memory loaded
   * under one claim never decides, nor writes, under another (the partition may have changed hands in
   * between). Otherwise commands are answered `unavailable`, undecided, and the next command reloads.
   * One process serving everything: a constant.
   */
  readonly servingEpoch: (user: string) => number | undefined
  /** Asks for a `tick` at `deadline` (null: nothing due); a later call replaces the earlier one. */
  readonly scheduleDeadline: (actor: UserActor, deadline: number | null) => void
  /**
   * Called once, synchronously, when the actor stops taking commands: a load failure, its user not
   * servable here, a close requested by releaseWaiters, an interruption or a crash.
   */
  readonly onClose: (actor: UserActor) => void
  /** Called when a run ends and the actor stays open: it rests, idle or with waiters parked. */
  readonly onRest: (actor: UserActor) => void
}

/** The recency links are the coordinator's (RecencyList); nothing else reads or writes them. */
export interface UserActor extends RecencyLinks<UserActor> {
  readonly user: string
  /** Commands not yet taken, in arrival order; the coordinator bounds it (mailboxCapacity). */
  readonly mailbox: Array<Envelope>
  /** A fiber is running for it (loading, deciding or writing): never evicted, and not started twice. */
  busy: boolean
  /** That fiber while it runs, for interrupting it (dropped partitions, shutdown); cleared with `busy`. */
  running: Fiber.Fiber<void> | undefined
  /** Loaded on the fiber's first run; undefined until then and after a failed write (reloaded). */
  state: UserState | undefined
  /** The serving epoch recorded before `state` was loaded (see ActorSettings.servingEpoch). */
  epoch: number | undefined
  /**
   * The `acquire_slot` request waiting in the user's FIFO queue, by job (made on first use): one per
   * job, as the domain queues one waiter per job (a repeat wakes the earlier request `busy`).
   */
  parked: Map<string, Envelope> | undefined
  closed: boolean
  /**
   * Its partition is being stopped: once the mailbox is empty the run closes the actor instead of
   * idling, so waiters it parked are answered `unavailable` then rather than when their wait ends.
   */
  closeRequested: boolean
  /** The group being decided or written, answered `unavailable` if the actor is interrupted. */
  inFlight: ReadonlyArray<Envelope>
  /** The deadline the coordinator's timer holds for this actor (Infinity: none). */
  scheduledDeadline: number
  /** When it last decided something (Clock ms): idle eviction reads it. */
  lastActiveAt: number
  /** The coordinator's list of resting actors that holds it; undefined while it runs. Only the coordinator writes it. */
  restingIn: RecencyList<UserActor> | undefined
}

export const makeUserActor = (user: string, lastActiveAt: number): UserActor => ({
  user,
  mailbox: [],
  busy: false,
  running: undefined,
  state: undefined,
  epoch: undefined,
  parked: undefined,
  closed: false,
  closeRequested: false,
  inFlight: noEnvelopes,
  scheduledDeadline: Infinity,
  lastActiveAt,
  restingIn: undefined,
  newer: undefined,
  older: undefined
})

/** Waiters parked on this actor (0 when none were ever parked). */
export const parkedCount = (actor: UserActor): number => actor.parked?.size ?? 0

/**
 * Every answer goes through here: once per envelope, and a reply callback that throws is reported, not
 * let loose in the loops that answer the rest of a group.
 */
const answer = (envelope: Envelope, result: Result, settings: ActorSettings, user: string): void => {
  if (envelope.answered) return
  envelope.answered = true
  try {
    envelope.reply(result)
  } catch (cause) {
    settings.onError(user, "reply callback threw", cause)
  }
}

const answerAll = (
  envelopes: ReadonlyArray<Envelope>,
  result: Result,
  settings: ActorSettings,
  user: string
): void => {
  for (const envelope of envelopes) answer(envelope, result, settings, user)
}

/**
 * Answers `unavailable`, in arrival order, the waiters parked by earlier groups (their place in the
 * queue was memory only), then the group `inFlight` (its own parked waiters in place).
 */
const answerHeld = (actor: UserActor, inFlight: ReadonlyArray<Envelope>, settings: ActorSettings): void => {
  const parked = actor.parked
  actor.parked = undefined
  const current = new Set(inFlight)
  for (const envelope of parked?.values() ?? []) {
    if (!current.has(envelope)) answer(envelope, unavailable, settings, actor.user)
  }
  answerAll(inFlight, unavailable, settings, actor.user)
}

/**
 * Stops the actor: the registry forgets it first (synchronously, so no command is offered to it after
 * this, and a caller that enqueues again from inside its reply reaches a new actor), then everything it
 * still holds is answered `unavailable` in arrival order: waiters parked by earlier groups, the group
 * `inFlight` (being decided or written, its own parked waiters in place), the queue.
 */
export const closeActor = (
  actor: UserActor,
  settings: ActorSettings,
  inFlight: ReadonlyArray<Envelope> = []
): void => {
  actor.closed = true
  actor.busy = false
  actor.running = undefined
  actor.state = undefined
  actor.inFlight = noEnvelopes
  settings.onClose(actor)
  answerHeld(actor, inFlight, settings)
  answerAll(actor.mailbox.splice(0), unavailable, settings, actor.user)
}

/**
 * Ends the waits of a resting actor's parked waiters, answering each `busy` (its wait is over, with
 * retryAfterMs): what the coordinator does to the actor resting longest with waiters when more actors
 * than their bound (waitingActorsMax) rest with waiters. Their place in the queue was memory only, as
 * after a crash; they retry. The caller forgets the actor first, so a reply that enqueues again
 * reaches a new one.
 */
export const endWaits = (
  user: string,
  parked: ReadonlyMap<string, Envelope> | undefined,
  state: UserState | undefined,
  settings: ActorSettings
): void => {
  if (parked === undefined || state === undefined) return
  const ctx: DecideContext = { config: settings.config, now: settings.now(), random: settings.random }
  for (const envelope of parked.values()) {
    settings.metrics.slotBusy(planOf(settings.config, state))
    answer(envelope, busyResult(ctx, state), settings, user)
  }
}

/**
 * Loads the user's state into the actor, under the serving epoch read before the load (so the load
 * reads after that epoch's claim). None when the user is not servable here (nothing is read: it could
 * only be answered `unavailable`) or the load failed.
 */
const load = (actor: UserActor, settings: ActorSettings): Effect.Effect<Option.Option<UserState>> =>
  Effect.gen(function* () {
    actor.state = undefined
    const epoch = settings.servingEpoch(actor.user)
    if (epoch === undefined) return Option.none()
    const loaded = yield* Effect.exit(settings.store.load(actor.user, settings.now()))
    if (Exit.isFailure(loaded)) {
      settings.onError(actor.user, "load failed", Cause.squash(loaded.cause))
      return Option.none()
    }
    const state = userStateFromStored(actor.user, loaded.value)
    assertUserState(state)
    actor.state = state
    actor.epoch = epoch
    return Option.some(state)
  })

/**
 * Whether the actor may decide from its memory now: the user is servable here under the epoch its
 * memory was loaded under. Checked after every yield before a decision (a load, a recall, the turn's
 * yield): the partition may have been lost, or lost and claimed again, meanwhile.
 */
const decidesHere = (actor: UserActor, settings: ActorSettings): boolean =>
  actor.epoch !== undefined && settings.servingEpoch(actor.user) === actor.epoch

interface Group {
  readonly events: Array<StoreEvent>
  readonly replies: Array<readonly [Envelope, Result]>
  /** The domain's wakeups, appended by decideInto; each is read into `woken` right after its command. */
  readonly wakeups: Array<Wakeup>
  /** What the wakeups answer: the envelope parked for the job at the moment it was woken. */
  readonly woken: Array<readonly [Envelope, Result]>
}

const newGroup = (): Group => ({ events: [], replies: [], wakeups: [], woken: [] })

/**
 * Decides the group's commands in order into `group`; parks waiting `acquire_slot` replies. A wakeup
 * takes the envelope parked for its job when it is decided, so a retry that a later command of the
 * same group parks again waits for a wakeup of its own (answered with the earlier one's `busy`, its
 * caller would not know the slot the domain later grants it). A repeat of a waiting job is woken that
 * way before it is parked: a job never has two envelopes parked. May throw on an invariant violation.
 */
const decideGroup = (
  actor: UserActor,
  state: UserState,
  envelopes: ReadonlyArray<Envelope>,
  ctx: DecideContext,
  settings: ActorSettings,
  group: Group,
  decideUntil: number
): number => {
  const options = { assertFull: settings.assertFull }
  let decided = 0
  for (const envelope of envelopes) {
    // Past the turn (after at least one decision): the rest wait for the next group.
    if (decided > 0 && performance.now() >= decideUntil) break
    decided += 1
    const { command } = envelope
    const wakeupsBefore = group.wakeups.length
    const result = decideInto(state, command, ctx, group, options)
    for (let index = wakeupsBefore; index < group.wakeups.length; index += 1) {
      const { job, result: woken } = group.wakeups[index]!
      const waiting = actor.parked?.get(job)
      if (waiting === undefined) continue
      actor.parked!.delete(job)
      group.woken.push([waiting, woken])
    }
    if (result !== null) group.replies.push([envelope, result])
    else if (command.op === "acquire_slot") {
      actor.parked ??= new Map()
      if (actor.parked.has(command.job))
        throw new Error(`bug: a second request parked for job ${command.job} (the domain woke none)`)
      actor.parked.set(command.job, envelope)
    } else group.replies.push([envelope, { status: "ok" }])
  }
  if (actor.parked?.size === 0) actor.parked = undefined
  return decided
}

/** What a group answers: the envelopes its wakeups took (parked by earlier groups), then its commands. */
const heldBy = (group: Group, envelopes: ReadonlyArray<Envelope>): ReadonlyArray<Envelope> =>
  group.woken.length === 0 ? envelopes : [...group.woken.map(([waiting]) => waiting), ...envelopes]

/**
 * One run of the actor: load if needed, then decide groups until the mailbox is empty. Every failure
 * inside is answered and recovered from; an interruption (eviction, shutdown, a simulated crash) or a
 * defect outside the decisions answers whatever is in flight or queued `unavailable` and closes the
 * actor, so no command waits for an answer that cannot come.
 */
export const runUserActor = (actor: UserActor, settings: ActorSettings): Effect.Effect<void> =>
  Effect.onExit(drainMailbox(actor, settings), (exit) =>
    Exit.isSuccess(exit)
      ? Effect.void
      : Effect.sync(() => {
          if (!Cause.hasInterruptsOnly(exit.cause))
            settings.onError(actor.user, "actor crashed", Cause.squash(exit.cause))
          closeActor(actor, settings, actor.inFlight)
        })
  )

/** Decides the group into `group`; false (reported) when a decision crashed. */
const decideOrReport = (
  actor: UserActor,
  state: UserState,
  envelopes: ReadonlyArray<Envelope>,
  ctx: DecideContext,
  settings: ActorSettings,
  group: Group,
  decideUntil: number
): number | undefined => {
  try {
    return decideGroup(actor, state, envelopes, ctx, settings, group, decideUntil)
  } catch (cause) {
    settings.onError(actor.user, "decision crashed (invariant violation or bug)", cause)
    return undefined
  }
}

/**
 * Brings into memory the closed holds and `adjust` ids the group's commands name that memory may have
 * forgotten (none unless the state says it forgot some). False (reported) when the store failed.
 */
const recallForgottenIds = (
  actor: UserActor,
  state: UserState,
  envelopes: ReadonlyArray<Envelope>,
  settings: ActorSettings
): Effect.Effect<boolean> => {
  const wanted = idsToRecall(
    state,
    envelopes.map((envelope) => envelope.command)
  )
  if (wanted.holds.length === 0 && wanted.adjustments.length === 0) return Effect.succeed(true)
  return Effect.gen(function* () {
    for (let from = 0; from < wanted.holds.length || from < wanted.adjustments.length; from += recallIdsMax) {
      const recalled = yield* Effect.exit(
        settings.store.recall(
          actor.user,
          {
            holds: wanted.holds.slice(from, from + recallIdsMax),
            adjustments: wanted.adjustments.slice(from, from + recallIdsMax)
          },
          settings.now()
        )
      )
      if (Exit.isFailure(recalled)) {
        settings.onError(actor.user, "recall failed", Cause.squash(recalled.cause))
        return false
      }
      rememberRecalled(state, recalled.value)
    }
    return true
  })
}

/**
 * A write refused as a repeat of a change the store already holds says memory was behind the database:
 * a decision was made again from a state that missed it (issue 26). Reported as such, with the
 * constraint, so it is never read as one more failed write.
 */
const reportWriteFailed = (
  user: string,
  cause: Cause.Cause<StoreUnavailable>,
  settings: ActorSettings
): void => {
  const error = Cause.findErrorOption(cause)
  const alreadyHeld = Option.isSome(error) ? error.value.alreadyHeld : undefined
  settings.onError(
    user,
    alreadyHeld === undefined
      ? "write failed"
      : `memory was behind the database: the store already holds a change decided again (${alreadyHeld})`,
    Cause.squash(cause)
  )
}

/**
 * Reads the past periods each `usage_history` of the group answers with (revision 1.3), into its
 * command: the decision itself reads no store. False (reported) when the store failed.
 */
const readPastUsage = (
  actor: UserActor,
  envelopes: ReadonlyArray<Envelope>,
  settings: ActorSettings
): Effect.Effect<boolean> => {
  if (!envelopes.some((envelope) => envelope.command.op === "usage_history")) return Effect.succeed(true)
  return Effect.gen(function* () {
    for (const envelope of envelopes) {
      const command = envelope.command
      if (command.op !== "usage_history") continue
      const meters = usageHistoryMeters(settings.config, command)
      if ("status" in meters) continue
      // One more than asked: the current period's row may be among the newest.
      const read = yield* Effect.exit(
        settings.store.pastUsage(
          actor.user,
          meters.map(({ meter }) => meter),
          command.periods + 1
        )
      )
      if (Exit.isFailure(read)) {
        settings.onError(actor.user, "reading past usage failed", Cause.squash(read.cause))
        return false
      }
      envelope.command = { ...command, past: read.value }
    }
    return true
  })
}

const drainMailbox = (actor: UserActor, settings: ActorSettings): Effect.Effect<void> =>
  Effect.gen(function* () {
    let state = actor.state
    if (state === undefined) {
      const loaded = yield* load(actor, settings)
      if (Option.isNone(loaded)) return closeActor(actor, settings)
      state = loaded.value
      settings.scheduleDeadline(actor, nextDeadline(settings.config, state))
    }

    for (;;) {
      // Checked and cleared with no yield in between: a command enqueued after this sees `busy`
      // false and starts the next run, so none waits unnoticed.
      if (actor.mailbox.length === 0) {
        if (actor.closeRequested) return closeActor(actor, settings)
        actor.busy = false
        actor.running = undefined
        settings.onRest(actor)
        return
      }
      // The loop's turn is spent (this actor's groups that wrote nothing, or other actors started in the
      // same turn): give it back before deciding more.
      if (performance.now() >= turnEndsAt()) yield* Effect.yieldNow
      let envelopes = actor.mailbox.splice(0, settings.decisionsPerWriteMax)
      // Not servable under the epoch its memory was loaded under: the owner is elsewhere, this process
      // has not renewed in time, or it lost the partition and claimed it again since the load. Its
      // memory may be stale, so nothing is decided from it: this group, the queue and the parked
      // waiters (whose place in the queue was memory only) are answered `unavailable`, and the next
      // command reloads.
      if (!decidesHere(actor, settings)) return closeActor(actor, settings, envelopes)
      // Ids memory no longer holds (a capped load, the cap) are asked of the store first: the retry
      // window holds through the store, not only through what this actor happens to remember.
      if (
        !(yield* recallForgottenIds(actor, state, envelopes, settings)) ||
        !(yield* readPastUsage(actor, envelopes, settings))
      ) {
        answerAll(envelopes, unavailable, settings, actor.user)
        continue
      }
      // The recall yielded to the store: the partition may have been lost meanwhile, and a group that
      // writes nothing would be answered from memory with no fence to stop it.
      if (!decidesHere(actor, settings)) return closeActor(actor, settings, envelopes)
      const decidedAt = settings.now()
      const ctx: DecideContext = { config: settings.config, now: decidedAt, random: settings.random }
      const decided = newGroup()
      const decidedCount = decideOrReport(actor, state, envelopes, ctx, settings, decided, turnEndsAt())
      const decidedWell = decidedCount !== undefined
      if (decidedWell && decidedCount < envelopes.length) {
        // Cut short by the turn: the rest are the next group's, in their order.
        actor.mailbox.unshift(...envelopes.slice(decidedCount))
        envelopes = envelopes.slice(0, decidedCount)
      }
      // A period never goes back, across reloads too: the store learns the day the decisions reached.
      const periodFloor = decidedWell ? periodFloorToStore(state) : undefined
      if (periodFloor !== undefined) decided.events.push(periodFloor)
      // Set before the first yield: the waiters its wakeups took are answered with the group (or
      // `unavailable` with it, or by closeActor if the actor is interrupted).
      actor.inFlight = heldBy(decided, envelopes)
      let confirmed: Group | undefined
      if (!decidedWell) confirmed = undefined
      else if (decided.events.length === 0) confirmed = decided
      else {
        const written = yield* Effect.exit(settings.store.write(decided.events, actor.epoch))
        if (Exit.isSuccess(written)) {
          confirmed = decided
          settings.onPersisted(confirmed.events)
        } else reportWriteFailed(actor.user, written.cause, settings)
      }

      if (confirmed === undefined) {
        // Nothing of this group is confirmed: answer it all `unavailable` and start again from the store.
        answerHeld(actor, heldBy(decided, envelopes), settings)
        actor.inFlight = noEnvelopes
        const reloaded = yield* load(actor, settings)
        if (Option.isNone(reloaded)) return closeActor(actor, settings)
        state = reloaded.value
      } else {
        for (const [envelope, result] of confirmed.replies) {
          if (result.status === "busy") settings.metrics.slotBusy(planOf(settings.config, state))
          answer(envelope, result, settings, actor.user)
        }
        for (const [waiting, result] of confirmed.woken) {
          if (result.status === "busy") settings.metrics.slotBusy(planOf(settings.config, state))
          answer(waiting, result, settings, actor.user)
        }
      }
      actor.lastActiveAt = decidedAt
      actor.inFlight = noEnvelopes
      const deadline = nextDeadline(settings.config, state)
      // After a failed write, what fell due (an expiry the store refused: the events outbox full, the
      // write fenced) is tried again after a pause, not at once in a loop of loads and refusals.
      settings.scheduleDeadline(
        actor,
        confirmed === undefined && deadline !== null
          ? Math.max(deadline, decidedAt + failedWriteRetryDelayMs)
          : deadline
      )
    }
  })
