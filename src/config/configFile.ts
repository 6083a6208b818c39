/**
 * The meters-and-plans file (`QUOTA_CONFIG`, shape in PROTOCOL.md "Configuration") turned into the
 * domain `Config`, with the environment's fairness settings applied. The coordinator refuses to start on
 * a file that does not fit: every refusal names the path of what is wrong (`plans.pro.limits.tokens`).
 * Unknown keys are refused too (except a top-level `$schema`): a typo such as `limit` for `limits`
 * would otherwise silently give every meter limit 0.
 */
import { readFile } from "node:fs/promises"
import { Data, Effect } from "effect"
import type { Config, Period, PlanConfig } from "../domain/config.js"
import { defaultConfig, meterNamePattern } from "../domain/config.js"
import { clockOffsetMaxMsDefault } from "../domain/limits.js"
import { amountMax, identifierBytesMax, thresholdsPerMeterMax } from "../domain/limits.js"
import type { FairnessSettings, SeedPlan } from "./settings.js"

/** The file cannot be read or does not fit the shape; `path` is where in the file (or the file itself). */
export class ConfigFileInvalid extends Data.TaggedError("ConfigFileInvalid")<{
  readonly file: string
  readonly path: string
  readonly reason: string
}> {
  override get message(): string {
    return `${this.file}: ${this.path === "" ? "" : `${this.path}: `}${this.reason}`
  }
}

/** What the file holds; fairness comes from the environment. */
export type ConfigFileContents = Omit<Config, "fairness" | "clockOffsetMaxMs">

type Refusal = { readonly path: string; readonly reason: string }

/** Thrown inside the pure parser only; `parseConfigFile` turns it into a value. */
class ConfigShapeError {
  constructor(readonly refusal: Refusal) {}
}

const refuse = (path: string, reason: string): never => {
  throw new ConfigShapeError({ path, reason })
}

const periods: ReadonlyArray<Period> = ["month", "day", "none"]

const isRecord = (value: unknown): value is Record<string, unknown> =>
  typeof value === "object" && value !== null && !Array.isArray(value)

const recordAt = (value: unknown, path: string): Record<string, unknown> =>
  isRecord(value) ? value : refuse(path, "must be an object")

const onlyKeys = (record: Record<string, unknown>, path: string, allowed: ReadonlyArray<string>): void => {
  for (const key of Object.keys(record)) {
    if (!allowed.includes(key)) refuse(path === "" ? key : `${path}.${key}`, "unknown field")
  }
}

const integerAt = (value: unknown, path: string, max: number): number =>
  typeof value === "number" && Number.isSafeInteger(value) && value >= 0 && value <= max
    ? value
    : refuse(path, `must be an integer from 0 to ${max}, got ${JSON.stringify(value)}`)

const parseMeters = (value: unknown): Config["meters"] => {
  const meters = recordAt(value, "meters")
  return Object.entries(meters).map(([name, meter]) => {
    const path = `meters.${name}`
    if (!meterNamePattern.test(name)) refuse(path, `meter name must match ${meterNamePattern.source}`)
    const fields = recordAt(meter, path)
    onlyKeys(fields, path, ["period", "thresholds"])
    const period = fields["period"]
    if (!periods.includes(period as Period)) {
      refuse(`${path}.period`, `must be "month", "day" or "none", got ${JSON.stringify(period)}`)
    }
    return fields["thresholds"] === undefined
      ? { name, period: period as Period }
      : {
          name,
          period: period as Period,
          thresholds: parseThresholds(fields["thresholds"], `${path}.thresholds`)
        }
  })
}

/** Fractions of the limit above 0 (above 1 for overage alerts), at most thresholdsPerMeterMax, distinct; ascending. */
const parseThresholds = (value: unknown, path: string): ReadonlyArray<number> => {
  if (!Array.isArray(value)) return refuse(path, "must be an array of numbers above 0, such as [0.8, 1]")
  if (value.length > thresholdsPerMeterMax) refuse(path, `at most ${thresholdsPerMeterMax} thresholds`)
  const thresholds = value.map((threshold, index) =>
    typeof threshold === "number" && Number.isFinite(threshold) && threshold > 0
      ? threshold
      : refuse(`${path}.${index}`, `must be a number above 0, got ${JSON.stringify(threshold)}`)
  )
  if (new Set(thresholds).size !== thresholds.length) refuse(path, "must not repeat a threshold")
  return [...thresholds].sort((left, right) => left - right)
}

const parsePlan = (name: string, value: unknown, meterNames: ReadonlySet<string>): PlanConfig => {
  const path = `plans.${name}`
  if (name === "" || Buffer.byteLength(name) > identifierBytesMax || name.includes("\u0000")) {
    refuse(path, `plan name must be 1 to ${identifierBytesMax} UTF-8 bytes without NUL`)
  }
  const fields = recordAt(value, path)
  onlyKeys(fields, path, ["slots", "limits"])
  if (fields["slots"] === undefined) refuse(`${path}.slots`, "required")
  const slots = integerAt(fields["slots"], `${path}.slots`, amountMax)
  const limits: Array<[string, number]> = []
  if (fields["limits"] !== undefined) {
    for (const [meter, limit] of Object.entries(recordAt(fields["limits"], `${path}.limits`))) {
      const limitPath = `${path}.limits.${meter}`
      if (!meterNames.has(meter)) refuse(limitPath, "not a meter of this configuration")
      limits.push([meter, integerAt(limit, limitPath, amountMax)])
    }
  }
  // fromEntries defines own properties: a name such as `__proto__` stays a key, never a prototype.
  return { slots, limits: Object.fromEntries(limits) }
}

/** Validates parsed JSON; pure, so it is table-tested without files. */
export const parseConfigFile = (
  json: unknown
): { readonly ok: ConfigFileContents } | { readonly refused: Refusal } => {
  try {
    const root = recordAt(json, "")
    onlyKeys(root, "", ["$schema", "meters", "plans", "defaultPlan"])
    if (root["meters"] === undefined) refuse("meters", "required")
    const meters = parseMeters(root["meters"])
    const meterNames = new Set(meters.map((meter) => meter.name))
    if (root["plans"] === undefined) refuse("plans", "required")
    const planEntries = Object.entries(recordAt(root["plans"], "plans"))
    if (planEntries.length === 0) refuse("plans", "must name at least one plan")
    const plans: Record<string, PlanConfig> = Object.fromEntries(
      planEntries.map(([name, plan]) => [name, parsePlan(name, plan, meterNames)])
    )
    const defaultPlan = root["defaultPlan"] ?? "free"
    if (typeof defaultPlan !== "string") refuse("defaultPlan", "must be a string")
    if (!Object.hasOwn(plans, defaultPlan as string)) {
      refuse("defaultPlan", `plan ${JSON.stringify(defaultPlan)} is not in plans`)
    }
    return { ok: { meters, plans, defaultPlan: defaultPlan as string } }
  } catch (error) {
    if (error instanceof ConfigShapeError) return { refused: error.refusal }
    throw error
  }
}

/**
 * The file's plans with the environment's fairness: `FAIRNESS_*_LIMIT` replaces a plan's slots if it
 * exists. The clock bound comes from the environment too (`QUOTA_CLOCK_OFFSET_MAX_MS`).
 */
export const withFairness = (
  contents: ConfigFileContents,
  fairness: FairnessSettings,
  clockOffsetMaxMs: number = clockOffsetMaxMsDefault
): Config => {
  const plans = Object.fromEntries(
    Object.entries(contents.plans).map(([name, plan]): [string, PlanConfig] => {
      const slots = Object.hasOwn(fairness.slotOverrides, name)
        ? fairness.slotOverrides[name as SeedPlan]
        : undefined
      return [name, slots === undefined ? plan : { ...plan, slots }]
    })
  )
  return {
    ...contents,
    plans,
    fairness: {
      enabled: fairness.enabled,
      snoozeBaseMs: fairness.snoozeBaseMs,
      snoozeJitterMs: fairness.snoozeJitterMs
    },
    clockOffsetMaxMs
  }
}

/** Reads `configPath` (or takes the built-in default when it is undefined) and applies the fairness settings. */
export const loadConfig = (
  configPath: string | undefined,
  fairness: FairnessSettings,
  clockOffsetMaxMs: number = clockOffsetMaxMsDefault
): Effect.Effect<Config, ConfigFileInvalid> =>
  Effect.gen(function* () {
    if (configPath === undefined) return withFairness(defaultConfig, fairness, clockOffsetMaxMs)
    const file = configPath
    const text = yield* Effect.tryPromise({
      try: () => readFile(file, "utf8"),
      catch: (cause) => new ConfigFileInvalid({ file, path: "", reason: `cannot be read: ${String(cause)}` })
    })
    const json = yield* Effect.try({
      try: (): unknown => JSON.parse(text),
      catch: (cause) =>
        new ConfigFileInvalid({ file, path: "", reason: `is not JSON: ${(cause as Error).message}` })
    })
    const parsed = parseConfigFile(json)
    if ("refused" in parsed) return yield* new ConfigFileInvalid({ file, ...parsed.refused })
    return withFairness(parsed.ok, fairness, clockOffsetMaxMs)
  })
