/**
 * Where events go: a JetStream stream (PROTOCOL.md "Events"), created when missing (at start, and
 * again whenever a publish finds it gone), each event published with its id as `Nats-Msg-Id` and
 * acknowledged by the stream before its log row counts as published. nats.js failures are mapped here,
 * once, to `EventsUnavailable` or an unknown outcome.
 */
import type { NatsConnection } from "@nats-io/transport-node"
import type { JetStreamClient, JetStreamManager } from "@nats-io/jetstream"
import {
  DiscardPolicy,
  JetStreamApiCodes,
  JetStreamApiError,
  RetentionPolicy,
  StorageType,
  jetstream,
  jetstreamManager
} from "@nats-io/jetstream"
import { Data, Effect } from "effect"
import type { EventSettings } from "../config/eventSettings.js"
import { eventsPublishTimeoutMs } from "../domain/limits.js"

/** JetStream did not take the event (not enabled, the stream missing and not creatable, a timeout). */
export class EventsUnavailable extends Data.TaggedError("EventsUnavailable")<{ readonly reason: string }> {
  override get message(): string {
    return `events cannot be published: ${this.reason}`
  }
}

/** An event to publish: where, what, and its id (Nats-Msg-Id). */
export interface OutgoingEvent {
  readonly subject: string
  readonly body: string
  readonly eventId: string
}

/** A publish's outcome: the stream took it, or already had its id (kept once), or nothing is known. */
export type PublishOutcome = "new" | "duplicate" | undefined

export interface EventSinkShape {
  /** Creates the stream if it is missing (file storage, the settings' retention and duplicate window). */
  readonly ensureStream: Effect.Effect<void, EventsUnavailable>
  /**
   * Publishes every event, in order, all sent before any acknowledgement is awaited (one connection
   * keeps their order), and waits for each acknowledgement; an outcome per event, undefined where none
   * came (a timeout, a refusal: the stream may hold it). Fails only when the stream cannot be made sure of.
   */
  readonly publishAll: (
    events: ReadonlyArray<OutgoingEvent>
  ) => Effect.Effect<ReadonlyArray<PublishOutcome>, EventsUnavailable>
  /**
   * The stream's last message on `subjects` (a filter with wildcards): its id (Nats-Msg-Id), stream
   * sequence and time; null when it holds none (or the stream does not exist yet).
   */
  readonly lastEvent: (subjects: string) => Effect.Effect<StoredEventRef | null, EventsUnavailable>
  /**
   * The ids of the messages whose subject `matches`, walking back from stream sequence `fromSeq`
   * (itself included): at most `wanted` of them, reading at most `readMax` messages. `complete`: every
   * message of those subjects from the earliest id returned up to `fromSeq` is among them.
   */
  readonly eventIdsBefore: (
    fromSeq: number,
    matches: (subject: string) => boolean,
    wanted: number,
    readMax: number
  ) => Effect.Effect<{ readonly ids: ReadonlySet<string>; readonly complete: boolean }, EventsUnavailable>
}

/** A message of the stream, as far as the publisher needs to place it. */
export interface StoredEventRef {
  readonly eventId: string
  readonly seq: number
  readonly timeMs: number
}

const reasonOf = (cause: unknown): string => (cause instanceof Error ? cause.message : String(cause))

const nanos = (ms: number): number => ms * 1_000_000

export const makeJetStreamSink = (
  nc: NatsConnection,
  prefix: string,
  settings: EventSettings
): EventSinkShape => {
  const js: JetStreamClient = jetstream(nc, { timeout: eventsPublishTimeoutMs })
  let manager: JetStreamManager | undefined
  /** Set when a publish suggests the stream is gone: the next publish makes sure it exists first. */
  let checkStream = true

  const ensureStream = Effect.tryPromise({
    try: async () => {
      manager ??= await jetstreamManager(nc, { timeout: eventsPublishTimeoutMs })
      try {
        await manager.streams.info(settings.streamName)
      } catch (cause) {
        if (!(cause instanceof JetStreamApiError && cause.code === JetStreamApiCodes.StreamNotFound))
          throw cause
        await manager.streams.add({
          name: settings.streamName,
          subjects: [`${prefix}.v1.events.>`],
          storage: StorageType.File,
          retention: RetentionPolicy.Limits,
          discard: DiscardPolicy.Old,
          max_age: nanos(settings.maxAgeMs),
          max_bytes: settings.maxBytes,
          num_replicas: settings.replicas,
          duplicate_window: nanos(settings.duplicateWindowMs)
        })
      }
      checkStream = false
    },
    catch: (cause) => {
      manager = undefined
      return new EventsUnavailable({ reason: `stream ${settings.streamName}: ${reasonOf(cause)}` })
    }
  })

  const publishAll = (events: ReadonlyArray<OutgoingEvent>) =>
    Effect.andThen(
      Effect.suspend(() => (checkStream ? ensureStream : Effect.void)),
      Effect.promise(async (): Promise<ReadonlyArray<PublishOutcome>> => {
        // Sent in order now (each publish writes to the connection at once); acknowledged in any order.
        const sent = events.map(({ subject, body, eventId }) =>
          js.publish(subject, body, {
            msgID: eventId,
            expect: { streamName: settings.streamName },
            timeout: eventsPublishTimeoutMs
          })
        )
        const settled = await Promise.allSettled(sent)
        return settled.map((outcome) => {
          if (outcome.status === "fulfilled") return outcome.value.duplicate ? "duplicate" : "new"
          // No responders, a missing or wrong stream: look again before the next attempt.
          checkStream = true
          return undefined
        })
      })
    )

  const lastEvent = (subjects: string) =>
    Effect.tryPromise({
      try: async (): Promise<StoredEventRef | null> => {
        manager ??= await jetstreamManager(nc, { timeout: eventsPublishTimeoutMs })
        try {
          const last = await manager.streams.getMessage(settings.streamName, { last_by_subj: subjects })
          const eventId = last?.header?.get("Nats-Msg-Id")
          return last === null || eventId === undefined || eventId === ""
            ? null
            : { eventId, seq: last.seq, timeMs: last.time.getTime() }
        } catch (cause) {
          if (cause instanceof JetStreamApiError && cause.code === JetStreamApiCodes.StreamNotFound)
            return null
          throw cause
        }
      },
      catch: (cause) => {
        manager = undefined
        return new EventsUnavailable({ reason: `last message of ${subjects}: ${reasonOf(cause)}` })
      }
    })

  const eventIdsBefore = (
    fromSeq: number,
    matches: (subject: string) => boolean,
    wanted: number,
    readMax: number
  ) =>
    Effect.tryPromise({
      try: async () => {
        manager ??= await jetstreamManager(nc, { timeout: eventsPublishTimeoutMs })
        const first = (await manager.streams.info(settings.streamName)).state.first_seq
        const ids = new Set<string>()
        let seq = fromSeq
        for (let read = 0; seq >= first && ids.size < wanted && read < readMax; seq -= 1, read += 1) {
          // A message removed since (its age, the stream's bytes) answers as missing: nothing to find there.
          const message = await manager.streams.getMessage(settings.streamName, { seq }).catch(() => null)
          const eventId = message?.header?.get("Nats-Msg-Id")
          if (message !== null && eventId !== undefined && matches(message.subject)) ids.add(eventId)
        }
        return { ids, complete: ids.size >= wanted || seq < first }
      },
      catch: (cause) => {
        manager = undefined
        return new EventsUnavailable({ reason: `messages before ${fromSeq}: ${reasonOf(cause)}` })
      }
    })

  return { ensureStream, publishAll, lastEvent, eventIdsBefore }
}
