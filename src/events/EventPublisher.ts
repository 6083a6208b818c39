/**
 * The publisher of events: one fiber per partition this process serves, publishing the partition's
 * log rows' events to JetStream in log order (a user's events are in the order of its decisions), each
 * with its id as Nats-Msg-Id (eventIds.ts). The partition actor hands each confirmed append's events
 * over (EventQueue.ts); nothing is read from Postgres in steady state.
 *
 * Publishes are pipelined: up to eventsPublishInFlightMax are sent before their acknowledgements come
 * back, in order, on one connection. A publish that failed (a timeout, a lost connection: the stream
 * may hold its event, only the acknowledgement lost) is sent again with everything after it, under the
 * same ids, after a backoff: the duplicate window keeps one copy. A row leaves the queue, and counts as
 * published for the checkpoint (which deletes rows both checkpointed and published), only once every
 * event of it and before it was acknowledged. So a change is never removed from the log before its own
 * event is in the stream.
 *
 * When it starts (this process claimed the partition) it reads the log: what earlier owners appended and
 * did not see acknowledged. Rows the stream may already hold are published again unless certain to be
 * in it: with at most D publishes in flight, every event D or more before the stream's last event of the
 * partition was acknowledged before that one was sent, so those are skipped and the D - 1 before it and
 * everything after are sent again (kept once within the duplicate window; past it, at most those D - 1
 * could be a second copy with the same id, which consumers keep once, as PROTOCOL.md says). No gap is
 * ever skipped: an event not certain to be in the stream is sent.
 *
 * Nothing is published that the synchronous standby does not have: an append is confirmed only once its
 * COMMIT waited for the standby, and the log is read as the store's loads are, after commits of unknown
 * outcome are settled and replicated (outcomeDoubts.ts). Before each send it checks that this process
 * may still serve the partition: a stale owner publishes nothing more of a partition it lost.
 */
import { Deferred, Duration, Effect, Exit, FiberMap } from "effect"
import type { Scope } from "effect"
import {
  eventsDuplicateWindowMarginMs,
  eventsPublishInFlightMax,
  eventsRecoveryOpenWaitMsMax,
  eventsRecoveryRowsMax,
  eventsRecoveryScanMax,
  eventsRetryDelayMsMax,
  eventsRetryDelayMsMin,
  eventsWarningIntervalMs
} from "../domain/limits.js"
import type { MetricsRecorder } from "../ops/MetricsRecorder.js"
import type { EventLogShape, UnpublishedRows } from "./EventLog.js"
import { eventIdOf, eventPlaceOf } from "./eventIds.js"
import type { PublishedEvent, QueuedRow } from "./EventQueue.js"
import { EventQueue } from "./EventQueue.js"
import type { EventSinkShape } from "./JetStreamSink.js"

export interface EventPublisherOptions {
  readonly log: EventLogShape
  readonly sink: EventSinkShape
  readonly queue: EventQueue
  readonly prefix: string
  /** Whether this process may still publish for the partition (it owns it and its lease holds). */
  readonly servable: (partition: number) => boolean
  readonly metrics: MetricsRecorder
  readonly warn: (message: string, fields: Record<string, unknown>) => void
  /**
   * Resolves once the partition's log is opened here (Coordinator.whenOpened): a newly started
   * publisher reads the log after that, at most eventsRecoveryOpenWaitMsMax later. Absent: at once.
   */
  readonly opened?: (partition: number) => Effect.Effect<void>
  /** Publishes in flight at once (default eventsPublishInFlightMax); tests lower it. */
  readonly inFlightMax?: number
  /** The stream's duplicate window (QUOTA_EVENTS_DUPLICATE_WINDOW). */
  readonly duplicateWindowMs: number
}

export interface EventPublisher {
  /** Starts the publishers of partitions this process now serves (a running one is started afresh). */
  readonly start: (partitions: ReadonlyArray<number>) => Effect.Effect<void>
  /** Stops the publishers of partitions this process no longer serves; waits until they stopped. */
  readonly stop: (partitions: ReadonlyArray<number>) => Effect.Effect<void>
  /** Rows were queued for these partitions. */
  readonly wake: (partitions: Iterable<number>) => void
}

/** The event as published: kind, id, user and partition first, then what the decision recorded. */
export const publishedBody = (event: PublishedEvent, eventId: string, partition: number): string => {
  const { event: kind, at, ...fields } = event.event
  return JSON.stringify({ event: kind, eventId, user: event.user, partition, at, ...fields })
}

/** An event of the queue, in order: its id, and whether the stream is already known to hold it. */
interface Placed {
  readonly event: PublishedEvent
  readonly eventId: string
  readonly present: boolean
}

/** The queue's events from the `done`th on, at most `max` of them, each with its id. */
const nextEvents = (
  rows: ReadonlyArray<QueuedRow>,
  done: number,
  max: number,
  databaseTag: string,
  present: ReadonlySet<string>
): Array<Placed> => {
  const next: Array<Placed> = []
  let seen = 0
  for (const row of rows) {
    if (next.length >= max) break
    if (seen + row.events.length <= done) {
      seen += row.events.length
      continue
    }
    for (let index = 0; index < row.events.length && next.length < max; index += 1, seen += 1) {
      if (seen < done) continue
      const eventId = eventIdOf(databaseTag, { token: row.token, position: row.position, index: index + 1 })
      next.push({ event: row.events[index]!, eventId, present: present.has(eventId) })
    }
  }
  return next
}

export const makeEventPublisher = (
  options: EventPublisherOptions
): Effect.Effect<EventPublisher, never, Scope.Scope> =>
  Effect.gen(function* () {
    const { log, sink, queue, prefix, metrics } = options
    const inFlightMax = options.inFlightMax ?? eventsPublishInFlightMax
    const { duplicateWindowMs } = options
    const fibers = yield* FiberMap.make<number>()
    const wakers = new Map<number, Deferred.Deferred<void>>()
    let lastWarningAt = -Infinity

    const warnAtMostOncePerInterval = (message: string, fields: Record<string, unknown>): void => {
      const now = Date.now()
      if (now - lastWarningAt < eventsWarningIntervalMs) return
      lastWarningAt = now
      options.warn(message, { ...fields, pendingEvents: queue.total() })
    }

    /**
     * Reads what the log holds unpublished (page by page), and which of those events the stream holds
     * already: its last event of the partition, and every event D or more before it (acknowledged before
     * that one was sent). When that last event is older than the duplicate window, a re-send would be
     * kept as a second copy, so the D - 1 before it are looked up in the stream one by one.
     */
    const recover = (partition: number) =>
      Effect.gen(function* () {
        const rows: Array<QueuedRow> = []
        let persisted = 0
        let waiting = 0
        let events = 0
        let complete = false
        // Until memory's share is full or the log has no more: the rest is read once these are sent.
        for (let after: number | undefined = undefined; events < queue.heldPerPartitionMax;) {
          const page: UnpublishedRows = yield* log.unpublished(partition, after, eventsRecoveryRowsMax)
          if (after === undefined) {
            persisted = page.published
            waiting = page.waiting
          }
          rows.push(...page.rows)
          for (const row of page.rows) events += row.events.length
          complete = page.rows.length < eventsRecoveryRowsMax
          if (complete) break
          after = page.rows[page.rows.length - 1]!.position
        }
        // Queued before the stream is asked: while it cannot be, the rows count as pending, not published.
        queue.recovered(partition, persisted, rows, complete, waiting)
        const present = new Set<string>()
        const last = yield* sink.lastEvent(`${prefix}.v1.events.*.${partition}`)
        const place = last === null ? undefined : eventPlaceOf(log.databaseTag, last.eventId)
        const ids = place === undefined ? [] : nextEvents(rows, 0, Infinity, log.databaseTag, present)
        const order = place === undefined ? -1 : ids.findIndex(({ eventId }) => eventId === last!.eventId)
        if (order >= 0) {
          for (let index = 0; index <= order - inFlightMax; index += 1) present.add(ids[index]!.eventId)
          present.add(last!.eventId)
          if (Date.now() - last!.timeMs >= duplicateWindowMs - eventsDuplicateWindowMarginMs) {
            const suffix = `.${partition}`
            const found = yield* sink.eventIdsBefore(
              last!.seq,
              (subject) => subject.startsWith(`${prefix}.v1.events.`) && subject.endsWith(suffix),
              inFlightMax,
              eventsRecoveryScanMax
            )
            for (const eventId of found.ids) present.add(eventId)
          }
        }
        return present
      })

    /**
     * Sends the next events in order, pipelined (those the stream is known to hold are not sent), and
     * takes wholly acknowledged rows off the queue. Returns how many at the head are done, and whether
     * one failed (it and everything after it are sent again).
     */
    const publishSome = (partition: number, done: number, present: ReadonlySet<string>) =>
      Effect.gen(function* () {
        const rows = queue.rows(partition)
        const batch = nextEvents(rows, done, inFlightMax, log.databaseTag, present)
        const sending = batch.filter(({ present: known }) => !known)
        const outcomes = yield* sink.publishAll(
          sending.map(({ event, eventId }) => ({
            subject: `${prefix}.v1.events.${event.event.event}.${partition}`,
            body: publishedBody(event, eventId, partition),
            eventId
          }))
        )
        // In order: what was acknowledged (or known) before the first failure counts; the rest goes again.
        let acknowledged = 0
        let sent = 0
        for (const placed of batch) {
          if (!placed.present) {
            const outcome = outcomes[sent]
            sent += 1
            if (outcome === undefined) break
            metrics.eventPublished(placed.event.event.event, outcome === "duplicate")
          }
          acknowledged += 1
        }
        const upTo = done + acknowledged
        let rowsDone = 0
        let eventsDone = 0
        for (const row of rows) {
          if (eventsDone + row.events.length > upTo) break
          eventsDone += row.events.length
          rowsDone += 1
        }
        queue.published(partition, rowsDone, eventsDone)
        return { done: upTo - eventsDone, failed: acknowledged < batch.length }
      })

    /** Until interrupted: read the log, then publish whenever woken. */
    const runPartition = (partition: number): Effect.Effect<never> =>
      Effect.gen(function* () {
        let retryDelayMs = eventsRetryDelayMsMin
        /** A read or publish failed: warned (at most once an interval), then a wait that doubles each time. */
        const backOff = (error: string) =>
          Effect.suspend(() => {
            warnAtMostOncePerInterval("events are not being published; they wait in the log", {
              partition,
              error
            })
            const delayMs = retryDelayMs
            retryDelayMs = Math.min(eventsRetryDelayMsMax, retryDelayMs * 2)
            return Effect.sleep(Duration.millis(delayMs))
          })
        // Serving waits for the partition's open, publishing does not: the open goes first on the pool.
        if (options.opened !== undefined)
          yield* Effect.ignore(Effect.timeout(options.opened(partition), eventsRecoveryOpenWaitMsMax))
        let present: ReadonlySet<string> | undefined
        /** Events at the head of the queue acknowledged (their rows not wholly yet). */
        let done = 0
        for (;;) {
          const woken = Deferred.makeUnsafe<void>()
          wakers.set(partition, woken)
          if (present === undefined) {
            const recovered = yield* Effect.exit(recover(partition))
            if (Exit.isFailure(recovered)) {
              yield* backOff(String(recovered.cause))
              continue
            }
            present = recovered.value
          }
          if (queue.rows(partition).length === 0) {
            const from = queue.refilling(partition)
            if (from !== undefined) {
              // Memory was full: what it had no room for is read from the log, never from before it.
              const page = yield* Effect.exit(log.unpublished(partition, from - 1, eventsRecoveryRowsMax))
              queue.refilled(
                partition,
                Exit.isSuccess(page) ? page.value.rows : undefined,
                Exit.isSuccess(page) && page.value.rows.length < eventsRecoveryRowsMax
              )
              if (Exit.isFailure(page)) yield* backOff(String(page.cause))
              continue
            }
            retryDelayMs = eventsRetryDelayMsMin
            yield* Deferred.await(woken)
            continue
          }
          // A stale owner publishes nothing more of a partition it lost: the new owner publishes it.
          if (!options.servable(partition)) {
            yield* Effect.raceFirst(Effect.sleep(Duration.millis(retryDelayMs)), Deferred.await(woken))
            continue
          }
          const outcome = yield* Effect.exit(publishSome(partition, done, present))
          if (Exit.isSuccess(outcome)) done = outcome.value.done
          if (Exit.isFailure(outcome) || outcome.value.failed) {
            // The failed publish may be in the stream (only its acknowledgement lost): what the stream
            // holds is read again before anything is sent again, as at the start (a re-send past the
            // duplicate window would be kept as a second copy).
            present = undefined
            done = 0
            yield* backOff(Exit.isFailure(outcome) ? String(outcome.cause) : "a publish was not acknowledged")
            continue
          }
          retryDelayMs = eventsRetryDelayMsMin
        }
      })

    const start = (partitions: ReadonlyArray<number>) =>
      Effect.forEach(
        partitions,
        (partition) =>
          Effect.gen(function* () {
            // Each claim reads the log afresh: a publisher still running (one a step-down did not reach)
            // is replaced, as its memory of the log may lack what another owner appended meanwhile.
            yield* FiberMap.remove(fibers, partition)
            queue.open(partition)
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
            queue.close(partition)
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

export { EventQueue }
