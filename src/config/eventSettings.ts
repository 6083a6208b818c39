/**
 * The events settings (PROTOCOL.md "Events"): whether they are recorded and published, the JetStream
 * stream's name and retention, and the outbox's cap.
 *
 *   QUOTA_EVENTS_ENABLED           default true; false records and publishes none
 *   QUOTA_EVENTS_STREAM            default the prefix in upper case + "_EVENTS" (dots become "_")
 *   QUOTA_EVENTS_MAX_AGE           how long the stream keeps an event (default 30d)
 *   QUOTA_EVENTS_MAX_BYTES         the stream's size cap in bytes (default 1 GiB; the oldest go first)
 *   QUOTA_EVENTS_REPLICAS          the stream's replicas in a NATS cluster (default 1, at most 5)
 *   QUOTA_EVENTS_DUPLICATE_WINDOW  the stream's duplicate window (default 2m, at least 2m)
 *   QUOTA_EVENTS_OUTBOX_MAX        events recorded and not yet published per partition (default 100000)
 *   QUOTA_EVENTS_USAGE_RECORDED    default true; false decides, records and publishes no `usage_recorded`
 *                                  (one more outbox row per change of `used`) for deployments that do
 *                                  not bill from it
 */
import { Effect } from "effect"
import { eventsDuplicateWindowMsMin, eventsOutboxPerPartitionMaxDefault } from "../domain/limits.js"
import { invalid, readBoolean, readDuration, readInteger, valueOf } from "./readers.js"
import type { Environment } from "./SettingsInvalid.js"

export interface EventSettings {
  readonly enabled: boolean
  readonly streamName: string
  readonly maxAgeMs: number
  readonly maxBytes: number
  readonly replicas: number
  readonly duplicateWindowMs: number
  readonly outboxPerPartitionMax: number
  readonly usageRecorded: boolean
}

export const eventSettingsDefaults = {
  maxAgeMs: 30 * 86_400_000,
  maxBytes: 1_073_741_824,
  replicas: 1,
  duplicateWindowMs: eventsDuplicateWindowMsMin
} as const

/** JetStream stream names: no dots, wildcards or spaces. */
const streamNamePattern = /^[A-Za-z0-9_-]{1,255}$/

/** PROTOCOL.md: the prefix in upper case followed by `_EVENTS` (`QUOTA_EVENTS` for `quota`). */
export const defaultStreamName = (prefix: string): string =>
  `${prefix.toUpperCase().replaceAll(".", "_")}_EVENTS`

const readStreamName = (env: Environment, prefix: string) => {
  const name = valueOf(env, "QUOTA_EVENTS_STREAM") ?? defaultStreamName(prefix)
  return streamNamePattern.test(name)
    ? Effect.succeed(name)
    : invalid("QUOTA_EVENTS_STREAM", `must be letters, digits, _ or -, got ${JSON.stringify(name)}`)
}

export const readEventSettings = (env: Environment, prefix: string) =>
  Effect.gen(function* () {
    const enabled = yield* readBoolean(env, "QUOTA_EVENTS_ENABLED", true)
    const streamName = yield* readStreamName(env, prefix)
    const maxAgeMs = yield* readDuration(
      env,
      "QUOTA_EVENTS_MAX_AGE",
      eventSettingsDefaults.maxAgeMs,
      60_000,
      10 * 365 * 86_400_000
    )
    const maxBytes = yield* readInteger(
      env,
      "QUOTA_EVENTS_MAX_BYTES",
      1_048_576,
      Number.MAX_SAFE_INTEGER,
      eventSettingsDefaults.maxBytes
    )
    const replicas = yield* readInteger(env, "QUOTA_EVENTS_REPLICAS", 1, 5, eventSettingsDefaults.replicas)
    const duplicateWindowMs = yield* readDuration(
      env,
      "QUOTA_EVENTS_DUPLICATE_WINDOW",
      eventSettingsDefaults.duplicateWindowMs,
      eventsDuplicateWindowMsMin,
      86_400_000
    )
    const outboxPerPartitionMax = yield* readInteger(
      env,
      "QUOTA_EVENTS_OUTBOX_MAX",
      1,
      100_000_000,
      eventsOutboxPerPartitionMaxDefault
    )
    const usageRecorded = yield* readBoolean(env, "QUOTA_EVENTS_USAGE_RECORDED", true)
    return {
      enabled,
      usageRecorded,
      streamName,
      maxAgeMs,
      maxBytes: maxBytes ?? eventSettingsDefaults.maxBytes,
      replicas: replicas ?? eventSettingsDefaults.replicas,
      duplicateWindowMs,
      outboxPerPartitionMax: outboxPerPartitionMax ?? eventsOutboxPerPartitionMaxDefault
    } satisfies EventSettings
  })
