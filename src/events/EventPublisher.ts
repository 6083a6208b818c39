/**
 * The publisher of events: one fiber per partition this process serves, reading the partition's outbox
 * in recording order, publishing each event to JetStream (its id as Nats-Msg-Id) and waiting for the
 * stream's acknowledgement before the next, then removing what was published. A user's events are in
 * recording order within its partition, so they are published in the order of the decisions.
 *
 * It is woken when a commit recorded events of its partition. It reads its outbox when it starts (what a
 * previous owner left after a crash or a hand-off), and again every `eventsPollIntervalMs` only while
 * rows are known to wait; an idle partition reads nothing. One count of every partition's outbox every
 * `eventsIdleRecheckIntervalMs` finds rows nobody woke it for. While JetStream does
 * not take events it retries with a backoff and the outbox grows (`quota_events_pending`); the process
 * warns once per `eventsWarningIntervalMs`, not per event. Before each publish it checks that this
 * process may still serve the partition: a stale owner publishes nothing more of a partition it lost
 * (what it published meanwhile, the new owner publishes again under the same ids, and the stream's
 * duplicate window keeps one copy).
 *
 * Exactly once does not rest on the duplicate window alone: rows are removed only after a batch was
 * published, so an outage of Postgres between the two that outlasts the window (2 minutes by default)
 * would publish them again as new messages. Each partition's publisher therefore knows, per incarnation
 * of the database (Outbox.ts: seq goes back after a promotion or a restore, the incarnation changes),
 * the last recording order the stream holds for it: read from the stream when it starts (the last
 * message on the partition's subjects: a partition's events are published in recording order, each
 * acknowledged before the next), then advanced with every acknowledgement. A row of the same
 * incarnation at or below it is removed without being published again: its own event is in the stream.
 * A row of another incarnation is published (a re-publish within the duplicate window is kept once).
 * That holds only because a partition's rows commit in seq order: each write that records events
 * locks its partitions' outboxes first (writeEvents.ts, outboxLockNamespace).
 *
 * Nothing is published that the synchronous standby does not have: the outbox is read as the store's
 * loads are, after commits of unknown outcome are settled and replicated (outcomeDoubts.ts).
 *
 * A publish that failed has an unknown outcome: a timeout or a lost connection may come after the
 * stream stored the event and only its acknowledgement was lost. So the last recording order is read
 * from the stream again before the next publish: a retry after the duplicate window would otherwise
 * store the event a second time. What the stream stores after that read (a publish still in flight
 * when it was made) is stored within the window of the retry that follows it, which keeps one copy.
 */
import { Deferred, Duration, Effect, Exit, FiberMap } from "effect"
import type { Scope } from "effect"
import {
  eventsIdleRecheckIntervalMs,
  eventsPollIntervalMs,
  eventsPublishBatchMax,
  eventsRetryDelayMsMax,
  eventsRetryDelayMsMin,
  eventsWarningIntervalMs
} from "../domain/limits.js"
import type { MetricsRecorder } from "../ops/MetricsRecorder.js"
import type { EventSinkShape, EventsUnavailable } from "./JetStreamSink.js"
import type { OutboxRow, OutboxShape } from "./Outbox.js"
import { eventIdOf, outboxPositionOf } from "./Outbox.js"
import type { OutboxCounts } from "./OutboxCounts.js"

export interface EventPublisherOptions {
  readonly outbox: OutboxShape
  readonly sink: EventSinkShape
  readonly counts: OutboxCounts
  readonly prefix: string
  /** Whether this process may still publish for the partition (it owns it and its lease holds). */
  readonly servable: (partition: number) => boolean
  readonly metrics: MetricsRecorder
  readonly warn: (message: string, fields: Record<string, unknown>) => void
  readonly pollIntervalMs?: number
  readonly idleRecheckIntervalMs?: number
  readonly batchMax?: number
}

export interface EventPublisher {
  /** Starts the publishers of partitions this process now serves (a running one is left as it is). */
  readonly start: (partitions: ReadonlyArray<number>) => Effect.Effect<void>
  /** Stops the publishers of partitions this process no longer serves; waits until they stopped. */
  readonly stop: (partitions: ReadonlyArray<number>) => Effect.Effect<void>
  /** A commit recorded events of these partitions. */
  readonly wake: (partitions: Iterable<number>) => void
}

/** The event as published: kind, id, user and partition first, then what the decision recorded. */
export const publishedBody = (row: OutboxRow, partition: number, databaseTag: string): string => {
  const { event, at, ...fields } = JSON.parse(row.body) as { event: string; at: number }
  return JSON.stringify({
    event,
    eventId: eventIdOf(databaseTag, row),
    user: row.user,
    partition,
    at,
    ...fields
  })
}

/** Per incarnation of the database, the last seq of the partition that the stream holds. */
type Progress = Map<string, number>

/** `doubtful`: a publish failed, and the stream may hold its event (only the acknowledgement lost). */
type Outcome = "drained" | "more" | "failed" | "doubtful" | "lost"

export const makeEventPublisher = (
  options: EventPublisherOptions
): Effect.Effect<EventPublisher, never, Scope.Scope> =>
  Effect.gen(function* () {
    const { outbox, sink, counts, prefix, metrics } = options
    const pollIntervalMs = options.pollIntervalMs ?? eventsPollIntervalMs
    const idleRecheckIntervalMs = options.idleRecheckIntervalMs ?? eventsIdleRecheckIntervalMs
    const batchMax = options.batchMax ?? eventsPublishBatchMax
    const fibers = yield* FiberMap.make<number>()
    const wakers = new Map<number, Deferred.Deferred<void>>()
    let lastWarningAt = -Infinity

    const warnAtMostOncePerInterval = (message: string, fields: Record<string, unknown>): void => {
      const now = Date.now()
      if (now - lastWarningAt < eventsWarningIntervalMs) return
      lastWarningAt = now
      options.warn(message, { ...fields, pendingEvents: counts.total() })
    }

    /**
     * The last recording order of this database that the stream holds for the partition, by incarnation
     * (empty: none): what an earlier publisher of the partition, in this process or another, got
     * acknowledged.
     */
    const streamPublishedUpTo = (partition: number): Effect.Effect<Progress, EventsUnavailable> =>
      Effect.map(sink.lastEventId(`${prefix}.v1.events.*.${partition}`), (eventId) => {
        const last = eventId === null ? undefined : outboxPositionOf(outbox.databaseTag, eventId)
        return new Map(last === undefined ? [] : [[last.incarnation, last.seq]])
      })

    /**
     * Publishes the partition's oldest rows, in order, stopping at the first failure. `progress` holds
     * the last recording order the stream has for it, per incarnation: rows of that incarnation at or
     * below are removed unpublished.
     */
    const publishSome = (partition: number, progress: Progress): Effect.Effect<Outcome> =>
      Effect.gen(function* () {
        const rows = yield* outbox.read(partition, batchMax)
        // Nothing waits: what was counted in meanwhile (a commit counted after its rows were already
        // published) is set right here, within a poll interval.
        if (rows.length === 0) counts.set(partition, 0)
        const published: Array<number> = []
        let outcome: Outcome = rows.length === batchMax ? "more" : "drained"
        for (const row of rows) {
          if (row.seq <= (progress.get(row.incarnation) ?? 0)) {
            // Already in the stream: its removal failed after the publish (an outage of Postgres).
            published.push(row.seq)
            continue
          }
          if (!options.servable(partition)) {
            outcome = "lost"
            break
          }
          const sent = yield* Effect.exit(
            sink.publish(
              `${prefix}.v1.events.${row.kind}.${partition}`,
              publishedBody(row, partition, outbox.databaseTag),
              eventIdOf(outbox.databaseTag, row)
            )
          )
          if (Exit.isFailure(sent)) {
            warnAtMostOncePerInterval("events are not being published; they wait in the outbox", {
              partition,
              error: String(Exit.isFailure(sent) ? sent.cause : "")
            })
            outcome = "doubtful"
            break
          }
          published.push(row.seq)
          progress.set(row.incarnation, row.seq)
          metrics.eventPublished(row.kind, sent.value)
        }
        yield* outbox.remove(published)
        counts.published(partition, published.length)
        return outcome
      }).pipe(
        Effect.catch((error) =>
          Effect.sync((): Outcome => {
            warnAtMostOncePerInterval("the events outbox cannot be read", { partition, error: error.reason })
            return "failed"
          })
        )
      )

    /**
     * Until interrupted: count the outbox, learn what the stream already holds of the partition, then
     * publish whenever woken or every poll interval.
     */
    const runPartition = (partition: number): Effect.Effect<never> =>
      Effect.gen(function* () {
        let retryDelayMs = eventsRetryDelayMsMin
        const counted = yield* Effect.exit(outbox.count([partition]))
        if (Exit.isSuccess(counted)) counts.set(partition, counted.value.get(partition) ?? 0)
        let progress: Progress | undefined
        for (;;) {
          const woken = Deferred.makeUnsafe<void>()
          wakers.set(partition, woken)
          if (progress === undefined) {
            // Nothing is published before this is known: it could only be published twice.
            const known = yield* Effect.exit(streamPublishedUpTo(partition))
            if (Exit.isSuccess(known)) progress = known.value
            else
              warnAtMostOncePerInterval("events are not being published; they wait in the outbox", {
                partition,
                error: String(known.cause)
              })
          }
          const outcome = progress === undefined ? "failed" : yield* publishSome(partition, progress)
          if (outcome === "more") continue
          // What the stream holds is read again before the next publish: the failed one may be in it.
          if (outcome === "doubtful") progress = undefined
          if (outcome === "failed" || outcome === "doubtful") {
            yield* Effect.sleep(Duration.millis(retryDelayMs))
            retryDelayMs = Math.min(eventsRetryDelayMsMax, retryDelayMs * 2)
            continue
          }
          retryDelayMs = eventsRetryDelayMsMin
          // Idle: nothing known to wait, so nothing to read until a commit (or the recheck) wakes it.
          yield* counts.of(partition) === 0
            ? Deferred.await(woken)
            : Effect.raceFirst(Effect.sleep(Duration.millis(pollIntervalMs)), Deferred.await(woken))
        }
      })

    /** Counts every running partition's outbox in one statement and wakes those with rows. */
    const recheckIdle = Effect.gen(function* () {
      const running = [...wakers.keys()]
      if (running.length === 0) return
      const counted = yield* Effect.exit(outbox.count(running))
      if (Exit.isFailure(counted)) return
      for (const [partition, count] of counted.value) {
        if (count === 0 || counts.of(partition) > 0 || !wakers.has(partition)) continue
        counts.set(partition, count)
        wake([partition])
      }
    })
    yield* Effect.forkScoped(
      Effect.forever(Effect.andThen(Effect.sleep(Duration.millis(idleRecheckIntervalMs)), recheckIdle))
    )

    const start = (partitions: ReadonlyArray<number>) =>
      Effect.forEach(
        partitions,
        (partition) =>
          Effect.gen(function* () {
            if (yield* FiberMap.has(fibers, partition)) return
            yield* FiberMap.run(fibers, partition, runPartition(partition))
          }),
        { discard: true }
      )

    const stop = (partitions: ReadonlyArray<number>) =>
      Effect.forEach(
        partitions,
        (partition) =>
          Effect.gen(function* () {
            yield* FiberMap.remove(fibers, partition)
            wakers.delete(partition)
            counts.forget(partition)
          }),
        { discard: true }
      )

    const wake = (partitions: Iterable<number>) => {
      for (const partition of partitions) {
        const woken = wakers.get(partition)
        if (woken !== undefined) Deferred.doneUnsafe(woken, Exit.void)
      }
    }

    return { start, stop, wake }
  })
