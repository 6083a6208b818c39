/**
 * The coordinator: routes each command to its user's actor, creating actors on first use (state loaded
 * from the store), capping how many are resident, and sweeping expiries of users with no resident actor.
 */
import { Clock, Context, Deferred, Effect, Exit, Fiber, Layer, Option, Random, Scope } from "effect"
import type { Command, ListUsageCommand } from "../domain/commands.js"
import type { Config } from "../domain/config.js"
import type { StoreEvent } from "../domain/events.js"
import {
  actorDecisionsPerWriteMax,
  actorIdleMs,
  idleEvictionIntervalMsMin,
  mailboxCapacity,
  partitionsDefault,
  residentActorsMax,
  sweepIntervalMs,
  sweepUsersPerRunMax,
  waitingActorsMax
} from "../domain/limits.js"
import { partitionOf } from "../domain/partition.js"
import type { Result } from "../domain/results.js"
import { overloaded } from "../domain/results.js"
import { decideSystemJob } from "../domain/slots.js"
import { Store } from "../store/Store.js"
import type { MetricsRecorder } from "../ops/MetricsRecorder.js"
import { Metrics, noMetrics } from "../ops/MetricsRecorder.js"
import { reportingClockSteps } from "./clockSteps.js"
import { makeListUsage } from "./listUsage.js"
import { DeadlineHeap } from "./DeadlineHeap.js"
import { RecencyList } from "./RecencyList.js"
import type { ActorSettings, Envelope, Reply, UserActor } from "./UserActor.js"
import { closeActor, endWaits, makeEnvelope, makeUserActor, parkedCount, runUserActor } from "./UserActor.js"

export interface CoordinatorShape {
  /** Decides one command through its user's actor; never fails: store trouble answers `unavailable`, a full mailbox `overloaded`. */
  readonly submit: (command: Command) => Effect.Effect<Result>
  /**
   * Enqueues every command synchronously, in array order, then awaits all results (in the same order).
   * Commands of one user are decided in the order given.
   */
  readonly submitAll: (commands: ReadonlyArray<Command>) => Effect.Effect<ReadonlyArray<Result>>
  /**
   * Enqueues one command now; `reply` is called exactly once with its result, at once when it needs no
   * actor (a full mailbox, a system job), else from the actor once the result is durable. Callers that
   * enqueue in order are decided in that order per user: this is how the transports serve a message.
   */
  readonly enqueue: (command: Command, reply: Reply) => void
  /** Answers a `list_usage` (revision 1.3, a partition's, no actor): `reply` is called exactly once. */
  readonly listUsage: (command: ListUsageCommand, reply: Reply) => void
  /** Sends an expiry tick to every user the store reports as due: the orphan sweep, once. Returns how many. */
  readonly sweepOnce: Effect.Effect<number>
  /** How many actors are resident now. */
  readonly residentActors: () => number
  /** `acquire_slot` callers waiting in the FIFO queues of resident users now (O(resident actors)). */
  readonly slotWaiters: () => number
  /** Test hook for "crash": interrupts every actor and forgets all memory; the next command reloads from the store. */
  readonly dropAllActors: Effect.Effect<void>
  /**
   * Stops the actors of users in `partitions` (a partition handed off or lost): each is interrupted,
   * whatever it had queued answers `unavailable`, and the partition's next owner loads from the store.
   */
  readonly dropPartitions: (partitions: ReadonlyArray<number>) => Effect.Effect<void>
  /**
   * The transport stopped taking the partitions' messages (`"all"`: every partition): waiters parked on
   * their actors are answered `unavailable` now (a running actor first finishes what it was given, then
   * closes), since a waiter may wait minutes and would hold up the drain (a hand-off, a shutdown).
   * Callers retry with the same job. Meant to be followed by dropPartitions: a partition served again
   * before that keeps the close requested of its actors that were running.
   */
  readonly releaseWaiters: (partitions: ReadonlyArray<number> | "all") => Effect.Effect<void>
}

export class Coordinator extends Context.Service<Coordinator, CoordinatorShape>()(
  "quota-coordinator/Coordinator"
) {}

export interface CoordinatorOptions {
  readonly config: Config
  /** Recount every aggregate after each decision (tests). Default false. */
  readonly assertFull?: boolean
  readonly residentActorsMax?: number
  readonly waitingActorsMax?: number
  readonly mailboxCapacity?: number
  readonly actorIdleMs?: number
  readonly decisionsPerWriteMax?: number
  /** Run the orphan sweep every this many ms; 0 turns the periodic sweep off (tests call sweepOnce). */
  readonly sweepIntervalMs?: number
  readonly onError?: (user: string, message: string, cause: unknown) => void
  /** Told when the wall clock read earlier than before by a second or more (see clockSteps.ts). */
  readonly onClockStepBack?: (latestMs: number, readMs: number) => void
  readonly onPersisted?: (events: ReadonlyArray<StoreEvent>) => void
  /** The deployment's partition count; needed by dropPartitions. Default partitionsDefault. */
  readonly partitions?: number
  /**
   * Scaled out: the epoch under which this process may decide for the user now, undefined when it may
   * not (see ActorSettings.servingEpoch). Default: always, under one epoch.
   */
  readonly servingEpoch?: (user: string) => number | undefined
  /** Scaled out: whether this process serves the partition now (`list_usage`). Default: always. */
  readonly servesPartition?: (partition: number) => boolean
  /** Partitions this process owns, for the orphan sweep; undefined sweeps every user (one process). */
  readonly ownedPartitions?: () => ReadonlyArray<number> | undefined
}

/** A timer's tick answers nobody. */
const ignoreReply: Reply = () => {}

/** Counts the expiries a confirmed write made durable (metrics are told where expiry is decided). */
const countExpiries = (metrics: MetricsRecorder, events: ReadonlyArray<StoreEvent>): void => {
  for (const event of events) {
    if (event.kind === "hold" && event.hold.state === "expired") metrics.holdExpired(event.hold.meter)
  }
}

export const makeCoordinator = (
  options: CoordinatorOptions
): Effect.Effect<CoordinatorShape, never, Store | Scope.Scope> =>
  Effect.gen(function* () {
    const store = yield* Store
    const random = yield* Random.Random
    const clock = yield* Clock.Clock
    const metrics = Option.getOrElse(yield* Effect.serviceOption(Metrics), () => noMetrics)
    const context = yield* Effect.context<never>()
    const runFork = Effect.runForkWith(context)
    /**
     * Resident actors by user. Those resting (no run in progress) are also in one of two lists, least
     * recently used first: `idle` (nothing parked: evicted freely to make room) and `waiting` (waiters
     * parked, which only their waits' end lets go). A running actor is in neither. The resident cap
     * counts every actor but the waiting ones, which have a bound of their own: actors with waiters
     * cannot fill the cap (they did, and then each new user walked them all and was refused: issue
     * 20), and making room takes the oldest of a list, never a walk.
     */
    const actors = new Map<string, UserActor>()
    const idle = new RecencyList<UserActor>()
    const waiting = new RecencyList<UserActor>()
    const capacity = options.mailboxCapacity ?? mailboxCapacity
    const maxResident = options.residentActorsMax ?? residentActorsMax
    const maxWaiting = options.waitingActorsMax ?? waitingActorsMax

    const idleMs = options.actorIdleMs ?? actorIdleMs
    const deadlines = new DeadlineHeap<string>()
    /** What the timer sleeps until, and how to wake it early when an earlier deadline arrives. */
    let timerTarget = Infinity
    let wakeTimer = Deferred.makeUnsafe<void>()
    const scheduleDeadline = (actor: UserActor, deadline: number | null): void => {
      const at = deadline ?? Infinity
      if (at === actor.scheduledDeadline) return
      // The heap is keyed by user: an actor already dropped (its fiber not yet interrupted) must not
      // move the deadline of the user's next actor.
      if (actors.get(actor.user) !== actor) return
      actor.scheduledDeadline = at
      if (at === Infinity) {
        deadlines.delete(actor.user)
        return
      }
      deadlines.set(actor.user, at)
      if (at < timerTarget) Deferred.doneUnsafe(wakeTimer, Exit.void)
    }
    /** A forgotten actor's deadline goes with it; the orphan sweep finds what falls due (sweepOnce). */
    const forgetDeadline = (actor: UserActor): void => {
      if (actor.scheduledDeadline !== Infinity) deadlines.delete(actor.user)
      actor.scheduledDeadline = Infinity
    }

    const settings: ActorSettings = {
      config: options.config,
      store,
      now:
        options.onClockStepBack === undefined
          ? () => clock.currentTimeMillisUnsafe()
          : reportingClockSteps(() => clock.currentTimeMillisUnsafe(), options.onClockStepBack),
      random: () => random.nextDoubleUnsafe(),
      decisionsPerWriteMax: options.decisionsPerWriteMax ?? actorDecisionsPerWriteMax,
      scheduleDeadline,
      servingEpoch: options.servingEpoch ?? (() => 0),
      assertFull: options.assertFull ?? false,
      onError: options.onError ?? (() => {}),
      metrics,
      onPersisted:
        metrics === noMetrics
          ? (options.onPersisted ?? (() => {}))
          : (events) => {
              countExpiries(metrics, events)
              options.onPersisted?.(events)
            },
      onClose: (actor) => {
        if (actors.get(actor.user) !== actor) return
        forgetResident(actor)
      },
      onRest: (actor) => {
        if (actors.get(actor.user) !== actor || actor.closed) return
        rest(actor)
      }
    }

    /**
     * Puts a resting actor in its list as the most recently used (it has just run). Past the bound of
     * actors with waiters, the one resting longest has its waits ended.
     */
    const rest = (actor: UserActor): void => {
      unrest(actor)
      actor.restingIn = parkedCount(actor) === 0 ? idle : waiting
      actor.restingIn.touch(actor)
      while (waiting.size > maxWaiting) endWaitsOf(waiting.oldest!)
    }

    /** Takes an actor out of the list of resting actors that holds it, if any. */
    const unrest = (actor: UserActor): void => {
      actor.restingIn?.remove(actor)
      actor.restingIn = undefined
    }

    /** Takes an actor out of the resident set and forgets its deadline. */
    const forgetResident = (actor: UserActor): void => {
      // Only this actor's entry: the user may have a newer actor by now (a reply that enqueued again).
      if (actors.get(actor.user) === actor) actors.delete(actor.user)
      unrest(actor)
      forgetDeadline(actor)
    }

    const isIdle = (actor: UserActor): boolean =>
      !actor.busy && parkedCount(actor) === 0 && actor.mailbox.length === 0

    /** Forgets a resting actor: it has no fiber, so its memory goes with it. */
    const evict = (actor: UserActor): void => {
      forgetResident(actor)
      actor.closed = true
      actor.state = undefined
    }

    /**
     * Makes room for one more actor by evicting the least recently used idle one. O(1). False only when
     * every actor the cap counts is running (loading, deciding or writing), which ends by itself: a new
     * user is then `overloaded` for a moment, never for as long as someone waits.
     */
    const evictOne = (): boolean => {
      const oldest = idle.oldest
      if (oldest === undefined) return false
      if (!isIdle(oldest)) throw new Error(`bug: the actor of ${oldest.user} is listed idle while not idle`)
      evict(oldest)
      return true
    }

    /**
     * Evicts a resting actor with waiters, answering each `busy` (its wait is over, with retryAfterMs):
     * only past the bound of such actors. Forgotten first, so a reply that enqueues reaches a new actor.
     */
    const endWaitsOf = (actor: UserActor): void => {
      if (actor.busy) throw new Error(`bug: the actor of ${actor.user} is listed resting while running`)
      const { user, parked, state } = actor
      actor.parked = undefined
      evict(actor)
      endWaits(user, parked, state, settings)
    }

    const actorFor = (user: string): UserActor | undefined => {
      const resident = actors.get(user)
      if (resident !== undefined && !resident.closed) return resident
      // A closed actor still mapped is forgotten before it is replaced, so it holds no resident slot.
      if (resident !== undefined) forgetResident(resident)
      if (actors.size - waiting.size >= maxResident && !evictOne()) return undefined
      const actor = makeUserActor(user, clock.currentTimeMillisUnsafe())
      actors.set(user, actor)
      return actor
    }

    /**
     * Queues a command; the actor's fiber is started if it is not running (it leaves the resting lists
     * until the run ends). False when the mailbox is full.
     */
    const offer = (actor: UserActor, envelope: Envelope): boolean => {
      if (actor.mailbox.length >= capacity) return false
      actor.mailbox.push(envelope)
      if (!actor.busy) {
        actor.busy = true
        unrest(actor)
        const fiber = runFork(runUserActor(actor, settings))
        // Kept only while it runs (the actor clears it when it stops): a finished fiber kept until the
        // user's next command was most of what the coordinator promoted to the old generation.
        if (actor.busy && actors.get(actor.user) === actor) actor.running = fiber
      }
      return true
    }

    const enqueue = (command: Command, reply: Reply): void => {
      if (
        command.user === "" &&
        (command.op === "acquire_slot" || command.op === "renew_slot" || command.op === "release_slot")
      ) {
        return reply(decideSystemJob(command, clock.currentTimeMillisUnsafe()))
      }
      const actor = actorFor(command.user)
      if (actor === undefined || !offer(actor, makeEnvelope(command, reply))) reply(overloaded)
    }

    /** Enqueues in order and resumes with every result once the last arrives. */
    const awaitAll = (commands: ReadonlyArray<Command>): Effect.Effect<ReadonlyArray<Result>> =>
      Effect.callback<ReadonlyArray<Result>>((resume) => {
        const results = new Array<Result>(commands.length)
        let left = commands.length
        if (left === 0) return resume(Effect.succeed(results))
        commands.forEach((command, index) =>
          enqueue(command, (result) => {
            if (results[index] !== undefined) return
            results[index] = result
            left -= 1
            if (left === 0) resume(Effect.succeed(results))
          })
        )
      })

    /** Sends a `tick` to every resident actor whose deadline is due; moved deadlines are skipped. */
    const fireDueDeadlines = (now: number): void => {
      for (let top = deadlines.peek(); top !== undefined && top.at <= now; top = deadlines.peek()) {
        deadlines.pop()
        const actor = actors.get(top.key)
        if (actor === undefined || actor.closed || actor.scheduledDeadline !== top.at) continue
        actor.scheduledDeadline = Infinity
        // A full mailbox needs no tick: its next group applies everything due and schedules again.
        offer(actor, makeEnvelope({ op: "tick", user: actor.user }, ignoreReply))
      }
    }

    // One timer for all actors: it sleeps until the earliest deadline (on Effect's clock, so tests
    // drive it with TestClock) and is woken early when an earlier one is scheduled.
    const timer: Effect.Effect<never> = Effect.forever(
      Effect.gen(function* () {
        const now = yield* Clock.currentTimeMillis
        fireDueDeadlines(now)
        if (Deferred.isDoneUnsafe(wakeTimer)) wakeTimer = Deferred.makeUnsafe<void>()
        timerTarget = deadlines.peek()?.at ?? Infinity
        const woken = Deferred.await(wakeTimer)
        yield* timerTarget === Infinity
          ? woken
          : Effect.raceFirst(Effect.sleep(Math.max(1, timerTarget - now)), woken)
      })
    )

    /**
     * Evicts actors idle for idleMs (nothing queued, parked or in flight). The whole idle list is
     * walked: an actor's `lastActiveAt` is when it last decided, not when it came to rest, so the list's
     * order is not exactly theirs. The walk costs about 0.5 ms per 100 000 resident actors (measured),
     * every idleMs / 4.
     */
    const evictIdle = Effect.gen(function* () {
      const now = yield* Clock.currentTimeMillis
      const due: Array<UserActor> = []
      for (let actor = idle.oldest; actor !== undefined; actor = actor.newer) {
        if (actor.lastActiveAt + idleMs <= now && isIdle(actor)) due.push(actor)
      }
      for (const actor of due) evict(actor)
    })

    const sweepOnce = Effect.gen(function* () {
      const now = yield* Clock.currentTimeMillis
      const owned = options.ownedPartitions?.()
      if (owned !== undefined && owned.length === 0) return 0
      const users = yield* Effect.orElseSucceed(
        store.usersWithExpiries(now, sweepUsersPerRunMax, owned),
        () => []
      )
      yield* awaitAll(users.map((user): Command => ({ op: "tick", user })))
      return users.length
    })

    /** The resident actors of the users `chosen` picks, copied: closing one changes the map. */
    const residentsWhere = (chosen: (user: string) => boolean): Array<UserActor> =>
      [...actors.values()].filter((actor) => chosen(actor.user))

    const dropWhere = (drop: (user: string) => boolean) =>
      Effect.gen(function* () {
        const residents = residentsWhere(drop)
        const running: Array<Fiber.Fiber<void>> = []
        for (const actor of residents) {
          forgetResident(actor)
          // A running actor answers what it holds when interrupted; an idle one may still have
          // parked waiters, answered here.
          if (actor.busy && actor.running !== undefined) running.push(actor.running)
          else closeActor(actor, settings)
          actor.closed = true
        }
        yield* Fiber.interruptAll(running)
      })
    const dropAllActors = dropWhere(() => true)
    const partitionCount = options.partitions ?? partitionsDefault
    const inPartitions = (partitions: ReadonlyArray<number>) => {
      const chosen = new Set(partitions)
      return (user: string) => chosen.has(partitionOf(user, partitionCount))
    }
    const dropPartitions = (partitions: ReadonlyArray<number>) => dropWhere(inPartitions(partitions))
    const releaseWaiters = (partitions: ReadonlyArray<number> | "all") =>
      Effect.sync(() => {
        for (const actor of residentsWhere(partitions === "all" ? () => true : inPartitions(partitions))) {
          if (actor.busy) actor.closeRequested = true
          else if (parkedCount(actor) > 0) closeActor(actor, settings)
        }
      })

    yield* Effect.addFinalizer(() => dropAllActors)

    yield* Effect.forkScoped(timer)
    yield* Effect.forkScoped(
      Effect.forever(Effect.andThen(Effect.sleep(Math.max(idleEvictionIntervalMsMin, idleMs / 4)), evictIdle))
    )
    const interval = options.sweepIntervalMs ?? sweepIntervalMs
    if (interval > 0) {
      yield* Effect.forkScoped(Effect.forever(Effect.andThen(Effect.sleep(interval), sweepOnce)))
    }

    return {
      submit: (command) => Effect.map(awaitAll([command]), (results) => results[0]!),
      submitAll: awaitAll,
      enqueue,
      listUsage: makeListUsage({
        config: options.config,
        store,
        now: settings.now,
        servesPartition: options.servesPartition ?? (() => true),
        onError: (message, cause) => options.onError?.("", message, cause),
        runFork: (effect) => void runFork(effect)
      }),
      sweepOnce,
      residentActors: () => actors.size,
      slotWaiters: () => {
        let waiting = 0
        for (const actor of actors.values()) waiting += actor.state?.waiters.length ?? 0
        return waiting
      },
      dropAllActors,
      dropPartitions,
      releaseWaiters
    }
  })

export const coordinatorLayer = (options: CoordinatorOptions): Layer.Layer<Coordinator, never, Store> =>
  Layer.effect(Coordinator, makeCoordinator(options))
