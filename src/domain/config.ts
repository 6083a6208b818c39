/**
 * Meters, plans, fairness and the clock bound: the configuration every decision reads.
 * The shape of the JSON file (`QUOTA_CONFIG`) is PROTOCOL.md "Configuration"; parsing lives in src/config.
 */

export type Period = "month" | "day" | "none"

export interface PlanConfig {
  /** Concurrent slots on this plan. */
  readonly slots: number
  /** Limit per meter; a meter not listed has limit 0. */
  readonly limits: Readonly<Record<string, number>>
}

export interface FairnessConfig {
  /** `false` makes every `acquire_slot` succeed (the seed's switch). */
  readonly enabled: boolean
  /** `busy` answers `retryAfterMs` = snoozeBaseMs + a random part of snoozeJitterMs. */
  readonly snoozeBaseMs: number
  readonly snoozeJitterMs: number
}

export interface MeterConfig {
  readonly name: string
  readonly period: Period
  /**
   * Fractions of the limit whose crossing by `used` publishes a `usage_threshold` event, ascending;
   * absent: `thresholdsDefault`; `[]`: none.
   */
  readonly thresholds?: ReadonlyArray<number>
}

export interface Config {
  /** Meters in configuration order (the order of `get_usage`). */
  readonly meters: ReadonlyArray<MeterConfig>
  readonly plans: Readonly<Record<string, PlanConfig>>
  readonly defaultPlan: string
  readonly fairness: FairnessConfig
  /**
   * `QUOTA_CLOCK_OFFSET_MAX_MS`: the most a serving process's clock differs from Postgres's (a process
   * further off serves nothing). Decisions read it through clockSkewMaxMs, never a clock.
   */
  readonly clockOffsetMaxMs: number
  /**
   * Whether decisions that change `used` record a `usage_recorded` event (revision 1.3). Absent: they
   * do. `QUOTA_EVENTS_USAGE_RECORDED=false` turns it off for deployments that do not bill from it:
   * nothing of it is then decided, written or published.
   */
  readonly usageRecordedEvents?: boolean
}

/**
 * How far apart two serving processes' clocks can be: each is within clockOffsetMaxMs of Postgres's.
 * A deadline one process set (a lease's end, a hold's expiry) is acted on by another, whose clock may
 * run ahead by this much, only once its clock is this far past it: never before the deadline on the
 * clock that set it. A period read at a clock this far ahead is the latest any serving process can
 * have recorded.
 */
export const clockSkewMaxMs = (config: Config): number => 2 * config.clockOffsetMaxMs

export const meterNamePattern = /^[a-z][a-z0-9_]{0,62}$/

/** The built-in configuration, with the seeds' numbers (ADR-21 5 000 analyses, post-mortem 400 000 tokens, 1 GB storage, ADR-10 slots). */
export const defaultConfig: Config = {
  meters: [
    { name: "analysis", period: "month" },
    { name: "specview", period: "month" },
    { name: "tokens", period: "month" },
    { name: "storage_bytes", period: "none" }
  ],
  plans: {
    free: {
      slots: 1,
      limits: { analysis: 5_000, specview: 5_000, tokens: 400_000, storage_bytes: 1_000_000_000 }
    },
    pro: {
      slots: 3,
      limits: { analysis: 50_000, specview: 50_000, tokens: 4_000_000, storage_bytes: 10_000_000_000 }
    },
    pro_plus: {
      slots: 3,
      limits: { analysis: 100_000, specview: 100_000, tokens: 10_000_000, storage_bytes: 50_000_000_000 }
    },
    enterprise: {
      slots: 5,
      limits: {
        analysis: 1_000_000,
        specview: 1_000_000,
        tokens: 100_000_000,
        storage_bytes: 1_000_000_000_000
      }
    }
  },
  defaultPlan: "free",
  fairness: { enabled: true, snoozeBaseMs: 30_000, snoozeJitterMs: 10_000 },
  // One clock: every decision on the clock that set its deadlines (one process, the tests). `serve`
  // never decides with it: loadConfig sets QUOTA_CLOCK_OFFSET_MAX_MS (clockOffsetMaxMsDefault unset).
  clockOffsetMaxMs: 0
}

/**
 * The plan configured under `name`. Plans and limits are plain records keyed by names callers send
 * (`set_plan`) or operators write, so only own properties count: `constructor` or `__proto__` is not a plan.
 */
export const planNamed = (config: Config, name: string): PlanConfig | undefined =>
  Object.hasOwn(config.plans, name) ? config.plans[name] : undefined

/** A plan's limit for `meter`; a meter the plan does not list has limit 0. */
export const planLimit = (plan: PlanConfig, meter: string): number =>
  Object.hasOwn(plan.limits, meter) ? (plan.limits[meter] ?? 0) : 0

export const meterPeriod = (config: Config, meter: string): Period | undefined =>
  config.meters.find((candidate) => candidate.name === meter)?.period

/** PROTOCOL.md: a meter that lists none has these. */
export const thresholdsDefault: ReadonlyArray<number> = [0.8, 1]

/** The meter's thresholds, ascending (none for a meter not configured). */
export const meterThresholds = (config: Config, meter: string): ReadonlyArray<number> => {
  const configured = config.meters.find((candidate) => candidate.name === meter)
  return configured === undefined ? [] : (configured.thresholds ?? thresholdsDefault)
}
