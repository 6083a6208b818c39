/**
 * Deployment settings from the environment. The caller passes the environment in (`process.env`), so
 * tests hand a plain object and nothing here reads globals. Every bad value fails with the variable's
 * name; an empty variable counts as unset (`QUOTA_CONFIG=` in a compose file means "no file").
 */
import { Effect } from "effect"
import type { NatsConnectionSettings } from "./natsConnection.js"
import { readNatsConnectionSettings } from "./natsConnection.js"
import type { Environment } from "./SettingsInvalid.js"
import type { SettingsInvalid } from "./SettingsInvalid.js"
import { invalid, readBoolean, readDuration, readInteger, valueOf } from "./readers.js"
import type { EventSettings } from "./eventSettings.js"
import { readEventSettings } from "./eventSettings.js"
import { readPartitions, readPrefix } from "./subjectSettings.js"
import {
  clockOffsetMaxMsDefault,
  usagePeriodsKeptMax,
  usagePeriodsKeptMin,
  clockOffsetMaxMsMax,
  clockOffsetMaxMsMin,
  partitionLeaseMsDefault,
  partitionLeaseMsMax,
  partitionLeaseMsMin,
  storeQueryTimeoutMs,
  storeQueryTimeoutMsMax,
  storeQueryTimeoutMsMin
} from "../domain/limits.js"

export type { Environment } from "./SettingsInvalid.js"
export { SettingsInvalid } from "./SettingsInvalid.js"
export { parseDurationMs } from "./readers.js"

export type LogLevel = "fatal" | "error" | "warn" | "info" | "debug" | "trace" | "silent"

/** The plans whose slot counts the seed's `FAIRNESS_*_LIMIT` variables set. */
export type SeedPlan = "free" | "pro" | "pro_plus" | "enterprise"

export interface FairnessSettings {
  /** `FAIRNESS_ENABLED=false` makes every `acquire_slot` succeed. */
  readonly enabled: boolean
  /** Slot counts that replace the configured plans' `slots`; a plan not listed keeps its own. */
  readonly slotOverrides: Readonly<Partial<Record<SeedPlan, number>>>
  readonly snoozeBaseMs: number
  readonly snoozeJitterMs: number
}

export interface Settings {
  /** NATS_URL and the connection's authentication and TLS (src/config/natsConnection.ts). */
  readonly nats: NatsConnectionSettings
  /** Unset: an embedded database under `dataDir`. */
  readonly databaseUrl: string | undefined
  /** Path of the meters-and-plans JSON file; unset: the built-in default configuration. */
  readonly configPath: string | undefined
  readonly prefix: string
  readonly partitions: number
  readonly dataDir: string
  readonly logLevel: LogLevel
  readonly fairness: FairnessSettings
  /** `QUOTA_LEASE_MS`: how long a partition's owner holds it without renewing (scaling out). */
  readonly partitionLeaseMs: number
  /** `QUOTA_HTTP_ADDR`: where `serve` answers /metrics, /healthz and /readyz; undefined: `off`. */
  readonly httpAddress: HttpAddress | undefined
  /** `QUOTA_EVENTS_*`: the events stream and its outbox. */
  readonly events: EventSettings
  /**
   * `QUOTA_CLOCK_OFFSET_MAX_MS`: the most this process's clock may differ from Postgres's; beyond it the
   * process serves nothing until back within (src/cluster/ClockOffset.ts).
   */
  readonly clockOffsetMaxMs: number
  /** `QUOTA_STORE_QUERY_TIMEOUT`: how long the store waits for a statement's answer (default storeQueryTimeoutMs). */
  readonly storeQueryTimeoutMs: number
  /**
   * `QUOTA_USAGE_PERIODS_KEPT`: past periods of every meter kept for `usage_history` and `list_usage`,
   * the current one included (default and least usagePeriodsKeptMin); older ones are deleted.
   */
  readonly usagePeriodsKept: number
}

/** A host and a TCP port (0: any free port, logged once bound). */
export interface HttpAddress {
  readonly host: string
  readonly port: number
}

export const settingsDefaults = {
  prefix: "quota",
  partitions: 64,
  dataDir: ".data",
  logLevel: "info",
  snoozeBaseMs: 30_000,
  snoozeJitterMs: 10_000,
  httpAddress: "127.0.0.1:9464"
} as const

/** Snooze durations longer than a day are a typo (`30000s`), not a policy. */
const snoozeMsMax = 86_400_000
const snoozeDuration = (env: Environment, variable: string, fallback: number) =>
  readDuration(env, variable, fallback, 0, snoozeMsMax)

const logLevels: ReadonlyArray<LogLevel> = ["fatal", "error", "warn", "info", "debug", "trace", "silent"]

const seedPlanVariables: ReadonlyArray<readonly [SeedPlan, string]> = [
  ["free", "FAIRNESS_FREE_LIMIT"],
  ["pro", "FAIRNESS_PRO_LIMIT"],
  ["pro_plus", "FAIRNESS_PRO_PLUS_LIMIT"],
  ["enterprise", "FAIRNESS_ENTERPRISE_LIMIT"]
]

/** `host:port`, `[ipv6]:port` or `off`. */
export const parseHttpAddress = (text: string): HttpAddress | "off" | undefined => {
  if (text.toLowerCase() === "off") return "off"
  const match = /^(?:\[([0-9A-Fa-f:.]+)\]|([A-Za-z0-9.-]+)):(\d{1,5})$/.exec(text)
  if (match === null) return undefined
  const port = Number(match[3])
  return port <= 65_535 ? { host: match[1] ?? match[2]!, port } : undefined
}

const readHttpAddress = (env: Environment) => {
  const text = valueOf(env, "QUOTA_HTTP_ADDR") ?? settingsDefaults.httpAddress
  const address = parseHttpAddress(text)
  if (address === undefined)
    return invalid(
      "QUOTA_HTTP_ADDR",
      `must be host:port (e.g. 127.0.0.1:9464, 0.0.0.0:9464, [::1]:9464) or off, got ${JSON.stringify(text)}`
    )
  return Effect.succeed(address === "off" ? undefined : address)
}

const readLogLevel = (env: Environment) => {
  const level = valueOf(env, "LOG_LEVEL")?.toLowerCase() ?? settingsDefaults.logLevel
  return logLevels.includes(level as LogLevel)
    ? Effect.succeed(level as LogLevel)
    : invalid("LOG_LEVEL", `must be one of ${logLevels.join(", ")}, got ${JSON.stringify(level)}`)
}

const readSlotOverrides = (env: Environment) =>
  Effect.gen(function* () {
    const overrides: Partial<Record<SeedPlan, number>> = {}
    for (const [plan, variable] of seedPlanVariables) {
      const slots = yield* readInteger(env, variable, 0, Number.MAX_SAFE_INTEGER)
      if (slots !== undefined) overrides[plan] = slots
    }
    return overrides
  })

/** Reads every setting, failing on the first bad one with its variable's name. */
export const readSettings = (env: Environment): Effect.Effect<Settings, SettingsInvalid> =>
  Effect.gen(function* () {
    const nats = yield* readNatsConnectionSettings(env)
    const prefix = (yield* readPrefix(env)) ?? settingsDefaults.prefix
    const partitions = yield* readPartitions(env)
    const logLevel = yield* readLogLevel(env)
    const enabled = yield* readBoolean(env, "FAIRNESS_ENABLED", true)
    const slotOverrides = yield* readSlotOverrides(env)
    const snoozeBaseMs = yield* snoozeDuration(env, "FAIRNESS_SNOOZE_DURATION", settingsDefaults.snoozeBaseMs)
    const snoozeJitterMs = yield* snoozeDuration(
      env,
      "FAIRNESS_SNOOZE_JITTER",
      settingsDefaults.snoozeJitterMs
    )
    const partitionLeaseMs = yield* readInteger(
      env,
      "QUOTA_LEASE_MS",
      partitionLeaseMsMin,
      partitionLeaseMsMax,
      partitionLeaseMsDefault
    )
    const clockOffsetMaxMs = yield* readInteger(
      env,
      "QUOTA_CLOCK_OFFSET_MAX_MS",
      clockOffsetMaxMsMin,
      clockOffsetMaxMsMax,
      clockOffsetMaxMsDefault
    )
    const usagePeriodsKept = yield* readInteger(
      env,
      "QUOTA_USAGE_PERIODS_KEPT",
      usagePeriodsKeptMin,
      usagePeriodsKeptMax,
      usagePeriodsKeptMin
    )
    const httpAddress = yield* readHttpAddress(env)
    const events = yield* readEventSettings(env, prefix)
    const queryTimeoutMs = yield* readDuration(
      env,
      "QUOTA_STORE_QUERY_TIMEOUT",
      storeQueryTimeoutMs,
      storeQueryTimeoutMsMin,
      storeQueryTimeoutMsMax
    )
    return {
      nats,
      databaseUrl: valueOf(env, "DATABASE_URL"),
      configPath: valueOf(env, "QUOTA_CONFIG"),
      prefix,
      partitions: partitions ?? settingsDefaults.partitions,
      dataDir: valueOf(env, "QUOTA_DATA_DIR") ?? settingsDefaults.dataDir,
      logLevel,
      fairness: { enabled, slotOverrides, snoozeBaseMs, snoozeJitterMs },
      partitionLeaseMs: partitionLeaseMs ?? partitionLeaseMsDefault,
      httpAddress,
      events,
      clockOffsetMaxMs: clockOffsetMaxMs ?? clockOffsetMaxMsDefault,
      storeQueryTimeoutMs: queryTimeoutMs,
      usagePeriodsKept: usagePeriodsKept ?? usagePeriodsKeptMin
    }
  })
