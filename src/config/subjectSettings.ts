/**
 * The two settings that make subjects, read from QUOTA_PREFIX and QUOTA_PARTITIONS: shared by the
 * coordinator (src/config/settings.ts) and the client, so both read the same environment the same way.
 */
import { Effect } from "effect"
import { partitionsMax } from "../domain/limits.js"
import type { Environment, SettingsInvalid } from "./SettingsInvalid.js"
import { invalid, readInteger, valueOf } from "./readers.js"

/** Dot-separated NATS subject tokens without wildcards or spaces, so `{prefix}.v1.{p}.ops` is a plain subject. */
export const prefixPattern = /^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$/

/** QUOTA_PREFIX, or undefined when it is not set. */
export const readPrefix = (env: Environment): Effect.Effect<string | undefined, SettingsInvalid> => {
  const prefix = valueOf(env, "QUOTA_PREFIX")
  if (prefix === undefined || prefixPattern.test(prefix)) return Effect.succeed(prefix)
  return invalid(
    "QUOTA_PREFIX",
    `must be NATS subject tokens of letters, digits, _ or - separated by dots, got ${JSON.stringify(prefix)}`
  )
}

/** QUOTA_PARTITIONS (1 to partitionsMax), or undefined when it is not set. */
export const readPartitions = (env: Environment): Effect.Effect<number | undefined, SettingsInvalid> =>
  readInteger(env, "QUOTA_PARTITIONS", 1, partitionsMax)
