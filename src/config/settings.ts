/**
 * Deployment settings from the environment. The caller passes the environment in (`process.env`), so
 * tests hand a plain object and nothing here reads globals. Every bad value fails with the variable's
 * name; an empty variable counts as unset (`QUOTA_CONFIG=` in a compose file means "no file").
 */
import { Effect } from "effect"
import type { NatsConnectionSettings } from "./natsConnection.js"
import { readNatsConnectionSettings } from "./natsConnection.js"
import type { Environment } from "./SettingsInvalid.js"
import { SettingsInvalid } from "./SettingsInvalid.js"
import {
  partitionLeaseMsDefault,
  partitionLeaseMsMax,
  partitionLeaseMsMin,
  partitionsMax
} from "../domain/limits.js"

export type { Environment } from "./SettingsInvalid.js"
export { SettingsInvalid } from "./SettingsInvalid.js"

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

const logLevels: ReadonlyArray<LogLevel> = ["fatal", "error", "warn", "info", "debug", "trace", "silent"]

const seedPlanVariables: ReadonlyArray<readonly [SeedPlan, string]> = [
  ["free", "FAIRNESS_FREE_LIMIT"],
  ["pro", "FAIRNESS_PRO_LIMIT"],
  ["pro_plus", "FAIRNESS_PRO_PLUS_LIMIT"],
  ["enterprise", "FAIRNESS_ENTERPRISE_LIMIT"]
]

/** Dot-separated NATS subject tokens without wildcards or spaces, so `{prefix}.v1.{p}.ops` is a plain subject. */
const prefixPattern = /^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$/

const durationUnitsMs: Readonly<Record<string, number>> = { ms: 1, s: 1_000, m: 60_000, h: 3_600_000 }

/** `30s`, `500ms`, `2m`, `1h` or a plain number of milliseconds; undefined when it is none of these. */
export const parseDurationMs = (text: string): number | undefined => {
  const match = /^(\d+)(ms|s|m|h)?$/.exec(text.trim())
  if (match === null) return undefined
  const ms = Number(match[1]) * (durationUnitsMs[match[2] ?? "ms"] ?? 1)
  return Number.isSafeInteger(ms) ? ms : undefined
}

const valueOf = (env: Environment, variable: string): string | undefined => {
  const value = env[variable]
  return value === undefined || value.trim() === "" ? undefined : value.trim()
}

const invalid = (variable: string, reason: string) => Effect.fail(new SettingsInvalid({ variable, reason }))

const readInteger = (env: Environment, variable: string, min: number, max: number, fallback?: number) => {
  const text = valueOf(env, variable)
  if (text === undefined) return Effect.succeed(fallback)
  const value = /^\d+$/.test(text) ? Number(text) : NaN
  return Number.isSafeInteger(value) && value >= min && value <= max
    ? Effect.succeed(value)
    : invalid(variable, `must be an integer from ${min} to ${max}, got ${JSON.stringify(text)}`)
}

const readDuration = (env: Environment, variable: string, fallback: number) => {
  const text = valueOf(env, variable)
  if (text === undefined) return Effect.succeed(fallback)
  const ms = parseDurationMs(text)
  return ms !== undefined && ms <= snoozeMsMax
    ? Effect.succeed(ms)
    : invalid(
        variable,
        `must be a duration like 30s, 500ms, 2m or a number of milliseconds, at most 24h; got ${JSON.stringify(text)}`
      )
}

const readBoolean = (env: Environment, variable: string, fallback: boolean) => {
  const text = valueOf(env, variable)?.toLowerCase()
  if (text === undefined) return Effect.succeed(fallback)
  if (["true", "1", "yes", "on"].includes(text)) return Effect.succeed(true)
  if (["false", "0", "no", "off"].includes(text)) return Effect.succeed(false)
  return invalid(variable, `must be true or false, got ${JSON.stringify(text)}`)
}

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

const readPrefix = (env: Environment) => {
  const prefix = valueOf(env, "QUOTA_PREFIX") ?? settingsDefaults.prefix
  return prefixPattern.test(prefix)
    ? Effect.succeed(prefix)
    : invalid(
        "QUOTA_PREFIX",
        `must be NATS subject tokens of letters, digits, _ or - separated by dots, got ${JSON.stringify(prefix)}`
      )
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
    const prefix = yield* readPrefix(env)
    const partitions = yield* readInteger(
      env,
      "QUOTA_PARTITIONS",
      1,
      partitionsMax,
      settingsDefaults.partitions
    )
    const logLevel = yield* readLogLevel(env)
    const enabled = yield* readBoolean(env, "FAIRNESS_ENABLED", true)
    const slotOverrides = yield* readSlotOverrides(env)
    const snoozeBaseMs = yield* readDuration(env, "FAIRNESS_SNOOZE_DURATION", settingsDefaults.snoozeBaseMs)
    const snoozeJitterMs = yield* readDuration(env, "FAIRNESS_SNOOZE_JITTER", settingsDefaults.snoozeJitterMs)
    const partitionLeaseMs = yield* readInteger(
      env,
      "QUOTA_LEASE_MS",
      partitionLeaseMsMin,
      partitionLeaseMsMax,
      partitionLeaseMsDefault
    )
    const httpAddress = yield* readHttpAddress(env)
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
      httpAddress
    }
  })
