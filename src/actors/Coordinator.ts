/**
 * The coordinator: which partition actor serves which partition (PartitionActor.ts), made on a
 * partition's first command, with the process's bounds on users in memory (ResidentUsers.ts), idle
 * eviction, and the orphan sweep of users with something due and no one in memory to notice.
 *
 * The transport hands each command over with the partition its subject named (`enqueueIn`): the
 * partition is computed once per command, when the request is judged, and carried from there.
 */
import { randomBytes } from "node:crypto"
import { Clock, Context, Effect, Fiber, Layer, Option, Random, Scope } from "effect"
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
import { unavailable } from "../domain/results.js"
import { decideSystemJob } from "../domain/slots.js"
import { refuseListUsage } from "../domain/usageHistory.js"
import type { EventQueue } from "../events/EventQueue.js"
import { Store } from "../store/Store.js"
import type { MetricsRecorder } from "../ops/MetricsRecorder.js"
import { Metrics, noMetrics } from "../ops/MetricsRecorder.js"
import { reportingClockSteps } from "./clockSteps.js"
import type { PartitionSettings } from "./PartitionActor.js"
import { PartitionActor } from "./PartitionActor.js"
import type { Reply } from "./replies.js"
import { Residency } from "./ResidentUsers.js"

export type { Reply } from "./replies.js"

export interface CoordinatorShape {
  /** Decides one command through its partition's actor; never fails: store trouble answers `unavailable`. */
  readonly submit: (command: Command) => Effect.Effect<Result>
  /**
   * Enqueues every command synchronously, in array order, then awaits all results (in the same order).
   * Commands of one user are decided in the order given.
   */
  readonly submitAll: (commands: ReadonlyArray<Command>) => Effect.Effect<ReadonlyArray<Result>>
  /**
   * Enqueues one command of `partition` (its user's, as the subject said and the transport checked);
   * `reply` is called exactly once with its result: at once when it needs no actor (`overloaded`, a
   * system job), else from the partition actor once the result is durable. Callers that enqueue in
   * order are decided in that order per user: this is how the transports serve a message.
   */
  readonly enqueueIn: (partition: number, command: Command, reply: Reply) => void
  /** `enqueueIn` with the partition computed from the user (callers that have no subject: tests, the sweep). */
  readonly enqueue: (command: Command, reply: Reply) => void
  /** Answers a `list_usage` (revision 1.3, a partition's, no user): `reply` is called exactly once. */
  readonly listUsage: (command: ListUsageCommand, reply: Reply) => void
  /** Sends an expiry tick to every user the store reports as due: the orphan sweep, once. Returns how many. */
  readonly sweepOnce: Effect.Effect<number>
  /**
   * Resolves once the partition's log is opened here (an earlier owner's tail in the tables), or the
   * partition is found not served here; starts the open if none runs.
   */
  readonly whenOpened: (partition: number) => Effect.Effect<void>
  /** How many users are in memory now. */
  readonly residentActors: () => number
  /** `acquire_slot` callers waiting in the FIFO queues of users in memory now (O(users in memory)). */
  readonly slotWaiters: () => number
  /** Test hook for "crash": stops every partition actor and forgets all memory; the next command reloads. */
  readonly dropAllActors: Effect.Effect<void>
  /**
   * Stops the actors of `partitions` (handed off or lost): whatever they hold answers `unavailable`, and
   * the partition's next owner loads from the store.
   */
  readonly dropPartitions: (partitions: ReadonlyArray<number> | "all") => Effect.Effect<void>
  /**
   * The transport stopped taking the partitions' messages (`"all"`: every partition): waiters are
   * answered `unavailable` now (a waiter may wait minutes and would hold up a hand-off or a shutdown;
   * its caller retries with the same job), then this waits, at most `timeoutMs`, until what the
   * partitions hold is decided and answered, and their logs checkpointed. True when it all was. Meant
   * to be followed by dropPartitions.
   */
  readonly drainPartitions: (
    partitions: ReadonlyArray<number> | "all",
    timeoutMs: number
  ) => Effect.Effect<boolean>
}

export class Coordinator extends Context.Service<Coordinator, CoordinatorShape>()(
  "quota-coordinator/Coordinator"
) {}

export interface CoordinatorOptions {
  readonly config: Config
  /** Recount every aggregate after each decision (tests). Default false. */
  readonly assertFull?: boolean
  /** Users in memory the cap counts (those at rest with waiters apart). */
  readonly residentActorsMax?: number
  /** Users at rest with waiters, apart from the cap. */
  readonly waitingActorsMax?: number
  /** Commands of one user queued and not yet decided. */
  readonly mailboxCapacity?: number
  readonly actorIdleMs?: number
  /** Commands a partition actor decides in one batch (one write). */
  readonly decisionsPerWriteMax?: number
  /** Run the orphan sweep every this many ms; 0 turns the periodic sweep off (tests call sweepOnce). */
  readonly sweepIntervalMs?: number
  readonly onError?: (user: string, message: string, cause: unknown) => void
  /** Told when the wall clock read earlier than before by a second or more (see clockSteps.ts). */
  readonly onClockStepBack?: (latestMs: number, readMs: number) => void
  readonly onPersisted?: (events: ReadonlyArray<StoreEvent>) => void
  /** The deployment's partition count. Default partitionsDefault. */
  readonly partitions?: number
  /**
   * Scaled out: the epoch under which this process may decide for the partition now, undefined when
   * it may not (see PartitionSettings.servingEpoch). Default: always, under one epoch.
   */
  readonly servingEpoch?: (partition: number) => number | undefined
  /** Partitions this process owns, for the orphan sweep; undefined sweeps every user (one process). */
  readonly ownedPartitions?: () => ReadonlyArray<number> | undefined
  /** Where appended events go to be published (QUOTA_EVENTS_ENABLED; absent: none are published). */
  readonly eventQueue?: EventQueue
}

/** Counts the expiries a confirmed write made durable (metrics are told where expiry is decided). */
const countExpiries = (metrics: MetricsRecorder, events: ReadonlyArray<StoreEvent>): void => {
  for (const event of events) {
    if (event.kind === "hold" && event.hold.state === "expired") metrics.holdExpired(event.hold.meter)
  }
}

type SlotCommand = Extract<Command, { op: "acquire_slot" | "renew_slot" | "release_slot" }>

/** A system job (empty user) needs no partition actor: it is always acquired and counts against nothing. */
const isSystemJob = (command: Command): command is SlotCommand =>
  command.user === "" &&
  (command.op === "acquire_slot" || command.op === "renew_slot" || command.op === "release_slot")

export const makeCoordinator = (
  options: CoordinatorOptions
): Effect.Effect<CoordinatorShape, never, Store | Scope.Scope> =>
  Effect.gen(function* () {
    const store = yield* Store
    const random = yield* Random.Random
    const clock = yield* Clock.Clock
    const metrics = Option.getOrElse(yield* Effect.serviceOption(Metrics), () => noMetrics)
    const runFork = Effect.runForkWith(yield* Effect.context<never>())
    const partitionCount = options.partitions ?? partitionsDefault
    const idleMs = options.actorIdleMs ?? actorIdleMs
    const onError = options.onError ?? (() => {})
    const servingEpoch = options.servingEpoch ?? (() => 0)

    const residency = new Residency({
      residentsMax: options.residentActorsMax ?? residentActorsMax,
      waitingMax: options.waitingActorsMax ?? waitingActorsMax
    })
    const settings: PartitionSettings = {
      config: options.config,
      store,
      now:
        options.onClockStepBack === undefined
          ? () => clock.currentTimeMillisUnsafe()
          : reportingClockSteps(() => clock.currentTimeMillisUnsafe(), options.onClockStepBack),
      random: () => random.nextDoubleUnsafe(),
      batchCommandsMax: options.decisionsPerWriteMax ?? actorDecisionsPerWriteMax,
      mailboxCapacity: options.mailboxCapacity ?? mailboxCapacity,
      assertFull: options.assertFull ?? false,
      residency,
      servingEpoch,
      metrics,
      onError,
      onPersisted:
        metrics === noMetrics
          ? (options.onPersisted ?? (() => {}))
          : (events) => {
              countExpiries(metrics, events)
              options.onPersisted?.(events)
            },
      runFork,
      newToken: () => randomBytes(8).toString("hex"),
      ...(options.eventQueue === undefined ? {} : { eventQueue: options.eventQueue })
    }

    /** The partition actors, each with its fiber, by partition. */
    const actors = new Map<number, { readonly actor: PartitionActor; readonly fiber: Fiber.Fiber<void> }>()
    const actorOf = (partition: number): PartitionActor => {
      const running = actors.get(partition)
      if (running !== undefined) return running.actor
      const actor = new PartitionActor(partition, settings)
      actors.set(partition, { actor, fiber: runFork(actor.run()) })
      return actor
    }

    const enqueueIn = (partition: number, command: Command, reply: Reply): void => {
      if (isSystemJob(command)) return reply(decideSystemJob(command, clock.currentTimeMillisUnsafe()))
      actorOf(partition).enqueue(command, reply)
    }
    const enqueue = (command: Command, reply: Reply): void =>
      enqueueIn(partitionOf(command.user, partitionCount), command, reply)

    const listUsage = (command: ListUsageCommand, reply: Reply): void => {
      const refused = refuseListUsage(options.config, command, settings.now())
      if (refused !== null) return reply(refused)
      if (servingEpoch(command.partition) === undefined) return reply(unavailable)
      // Read once every append of the partition is in the tables: the page shows every acknowledged change.
      actorOf(command.partition).read(
        (done) =>
          runFork(store.listUsage(command)).addObserver((exit) => {
            if (exit._tag === "Success")
              reply({ status: "ok", usage: exit.value.usage, more: exit.value.more })
            else {
              onError("", `list_usage of partition ${command.partition} failed`, exit.cause)
              reply(unavailable)
            }
            done()
          }),
        () => reply(unavailable)
      )
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

    const sweepOnce = Effect.gen(function* () {
      const owned = options.ownedPartitions?.()
      if (owned !== undefined && owned.length === 0) return 0
      // The tables are read only once every swept partition's log is opened here: what an earlier owner
      // left is in them by then (a user with changes still in the log is in memory, with its deadline).
      const swept = owned ?? Array.from({ length: partitionCount }, (_, partition) => partition)
      yield* Effect.promise(() =>
        Promise.all(
          swept.map((partition) => new Promise<void>((done) => actorOf(partition).whenOpened(done)))
        )
      )
      const now = yield* Clock.currentTimeMillis
      const users = yield* Effect.orElseSucceed(
        store.usersWithExpiries(now, sweepUsersPerRunMax, owned),
        () => []
      )
      yield* awaitAll(users.map((user): Command => ({ op: "tick", user })))
      return users.length
    })

    const chosen = (partitions: ReadonlyArray<number> | "all") =>
      partitions === "all"
        ? [...actors.values()]
        : partitions.flatMap((partition) => {
            const running = actors.get(partition)
            return running === undefined ? [] : [running]
          })

    const dropPartitions = (partitions: ReadonlyArray<number> | "all") =>
      Effect.gen(function* () {
        const dropped = chosen(partitions)
        const fibers: Array<Fiber.Fiber<unknown, unknown>> = []
        for (const { actor, fiber } of dropped) {
          actors.delete(actor.partition)
          fibers.push(fiber, ...actor.close())
        }
        yield* Fiber.interruptAll(fibers)
      })

    const drainPartitions = (partitions: ReadonlyArray<number> | "all", timeoutMs: number) =>
      Effect.promise(async () => {
        const draining = chosen(partitions)
        for (const { actor } of draining) actor.releaseWaiters()
        if (draining.length === 0) return true
        let timer: ReturnType<typeof setTimeout> | undefined
        const timedOut = new Promise<false>((resolve) => {
          timer = setTimeout(() => resolve(false), timeoutMs)
        })
        const idle = Promise.all(
          draining.map(({ actor }) => actor.whenIdle().then(() => actor.checkpointed()))
        ).then(() => true as const)
        const drained = await Promise.race([idle, timedOut])
        clearTimeout(timer)
        return drained
      })

    yield* Effect.addFinalizer(() => dropPartitions("all"))
    yield* Effect.forkScoped(
      Effect.forever(
        Effect.andThen(
          Effect.sleep(Math.max(idleEvictionIntervalMsMin, idleMs / 4)),
          Effect.flatMap(Clock.currentTimeMillis, (now) =>
            Effect.sync(() => residency.evictIdleSince(now - idleMs))
          )
        )
      )
    )
    const interval = options.sweepIntervalMs ?? sweepIntervalMs
    if (interval > 0) {
      yield* Effect.forkScoped(Effect.forever(Effect.andThen(Effect.sleep(interval), sweepOnce)))
    }

    return {
      submit: (command) => Effect.map(awaitAll([command]), (results) => results[0]!),
      submitAll: awaitAll,
      enqueueIn,
      enqueue,
      listUsage,
      sweepOnce,
      whenOpened: (partition) =>
        Effect.callback<void>((resume) => actorOf(partition).whenOpened(() => resume(Effect.void))),
      residentActors: () => residency.count,
      slotWaiters: () => {
        let waiting = 0
        for (const { actor } of actors.values()) waiting += actor.waiters()
        return waiting
      },
      dropAllActors: dropPartitions("all"),
      dropPartitions,
      drainPartitions
    }
  })

export const coordinatorLayer = (options: CoordinatorOptions): Layer.Layer<Coordinator, never, Store> =>
  Layer.effect(Coordinator, makeCoordinator(options))
