/**
 * Usage thresholds (PROTOCOL.md "Events"): after a decision that raised `used` or lowered a limit,
 * each configured fraction of the limit that `used` has reached, and that was not announced yet in
 * this period, is announced once with a `usage_threshold` event, ascending. The announced ones are
 * remembered with the period's usage row, so a later rise of the limit and a new crossing in the same
 * period do not repeat them, across restarts too. A limit of 0 crosses no threshold.
 */
import type { DecideContext, Output } from "./context.js"
import { meterThresholds } from "./config.js"
import type { MeterState, UserState } from "./state.js"
import { meterAt, meterLimit } from "./state.js"

/** A threshold as the decimal fraction it was written as (1.1 is 11/10), when it has one of at most 15 places. */
const decimalFraction = (threshold: number): { numerator: bigint; denominator: bigint } | undefined => {
  for (let places = 0, scale = 1; places <= 15; places += 1, scale *= 10) {
    const scaled = Math.round(threshold * scale)
    if (scaled / scale === threshold) return { numerator: BigInt(scaled), denominator: BigInt(scale) }
  }
  return undefined
}

/**
 * `used >= threshold * limit` as PROTOCOL.md means it, in decimals: in binary floating point 1.1 * 50
 * is 55.00000000000001, and 55 of 50 would not reach a 110 % threshold. Exact for thresholds written
 * with up to 15 decimal places; the product in floating point decides only far from the boundary.
 */
export const reachesThreshold = (used: number, threshold: number, limit: number): boolean => {
  const product = threshold * limit
  if (used > product * (1 + 1e-9)) return true
  if (used < product * (1 - 1e-9)) return false
  const fraction = decimalFraction(threshold)
  if (fraction === undefined) return used >= product
  return BigInt(used) * fraction.denominator >= fraction.numerator * BigInt(limit)
}

/**
 * Announces what `used` of `meter` has newly reached. Returns whether anything was announced (the
 * caller then writes the usage row, which carries what was announced).
 */
export const announceThresholds = (
  ctx: DecideContext,
  state: UserState,
  meter: string,
  output: Output
): boolean => {
  const meterState: MeterState = meterAt(ctx.config, state, meter, ctx.now)
  const limit = meterLimit(ctx.config, state, meter)
  if (limit <= 0 || meterState.used === 0) return false
  let crossed: Array<number> | undefined
  for (const threshold of meterThresholds(ctx.config, meter)) {
    if (
      !reachesThreshold(meterState.used, threshold, limit) ||
      meterState.thresholdsCrossed.includes(threshold)
    )
      continue
    crossed ??= [...meterState.thresholdsCrossed]
    crossed.push(threshold)
    output.events.push({
      kind: "event",
      user: state.user,
      event: {
        event: "usage_threshold",
        at: ctx.now,
        meter,
        periodStart: meterState.periodStart,
        threshold,
        limit,
        used: meterState.used
      }
    })
  }
  if (crossed === undefined) return false
  meterState.thresholdsCrossed = crossed.sort((left, right) => left - right)
  return true
}

/** The usage row of `meter` as it stands, for a decision that changed what it remembers. */
export const pushUsageRow = (ctx: DecideContext, state: UserState, meter: string, output: Output): void => {
  const meterState = meterAt(ctx.config, state, meter, ctx.now)
  output.events.push({
    kind: "usage",
    user: state.user,
    meter,
    periodStart: meterState.periodStart,
    used: meterState.used,
    thresholdsCrossed: meterState.thresholdsCrossed
  })
}
