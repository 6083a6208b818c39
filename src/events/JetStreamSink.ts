/**
 * Where events go: a JetStream stream (PROTOCOL.md "Events"), created when missing (at start, and
 * again whenever a publish finds it gone), each event published with its id as `Nats-Msg-Id` and
 * acknowledged by the stream before its outbox row is removed. nats.js failures are mapped here, once,
 * to `EventsUnavailable`.
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

export interface EventSinkShape {
  /** Creates the stream if it is missing (file storage, the settings' retention and duplicate window). */
  readonly ensureStream: Effect.Effect<void, EventsUnavailable>
  /**
   * Publishes one event and waits for the stream's acknowledgement; true when the stream already had
   * its id (a re-publish after a crash or a hand-off, kept once by the duplicate window).
   */
  readonly publish: (
    subject: string,
    body: string,
    eventId: string
  ) => Effect.Effect<boolean, EventsUnavailable>
  /**
   * The id (Nats-Msg-Id) of the stream's last message on `subjects` (a filter with wildcards), or null
   * when it holds none (or the stream does not exist yet).
   */
  readonly lastEventId: (subjects: string) => Effect.Effect<string | null, EventsUnavailable>
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

  const publish = (subject: string, body: string, eventId: string) =>
    Effect.andThen(
      checkStream ? ensureStream : Effect.void,
      Effect.tryPromise({
        try: () =>
          js.publish(subject, body, {
            msgID: eventId,
            expect: { streamName: settings.streamName },
            timeout: eventsPublishTimeoutMs
          }),
        catch: (cause) => {
          // No responders, a missing or wrong stream: look again before the next attempt.
          checkStream = true
          return new EventsUnavailable({ reason: `publish to ${subject}: ${reasonOf(cause)}` })
        }
      })
    ).pipe(Effect.map((ack) => ack.duplicate))

  const lastEventId = (subjects: string) =>
    Effect.tryPromise({
      try: async () => {
        manager ??= await jetstreamManager(nc, { timeout: eventsPublishTimeoutMs })
        try {
          const last = await manager.streams.getMessage(settings.streamName, { last_by_subj: subjects })
          return last?.header?.get("Nats-Msg-Id") ?? null
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

  return { ensureStream, publish, lastEventId }
}
