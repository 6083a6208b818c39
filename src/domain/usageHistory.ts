/**
 * Usage for billing (PROTOCOL.md revision 1.3): `usage_history`, a user's `used` per period, and the
 * checks of `list_usage`, a partition's users' `used` in one period. The current period comes from the
 * actor's memory; earlier ones from the store, read before the decision (they no longer change: every
 * change counts in the period of the decision that made it).
 */
import type { ListUsageCommand, UsageHistoryCommand } from "./commands.js"
import type { Config, Period } from "./config.js"
import { clockSkewMaxMs, meterPeriod } from "./config.js"
import type { DecideContext } from "./context.js"
import type { PeriodUsage } from "./events.js"
import { isPeriodStart, periodStartAt, periodStartBack } from "./period.js"
import type { InvalidRequestResult, Result, UnknownMeterResult, UsageHistoryEntry } from "./results.js"
import { invalidRequest, unknownMeter } from "./results.js"
import type { UserState } from "./state.js"
import { meterAt } from "./state.js"

const hasPeriod = (period: Period | undefined): period is "month" | "day" =>
  period === "month" || period === "day"

/**
 * The meters a `usage_history` covers, in configuration order, or why it is refused: a meter not
 * configured is `unknown_meter`, one without a period (`none`) `invalid_request`.
 */
export const usageHistoryMeters = (
  config: Config,
  command: UsageHistoryCommand
):
  | ReadonlyArray<{ readonly meter: string; readonly period: "month" | "day" }>
  | UnknownMeterResult
  | InvalidRequestResult => {
  if (command.meter === undefined) {
    return config.meters.flatMap(({ name, period }) => (hasPeriod(period) ? [{ meter: name, period }] : []))
  }
  const period = meterPeriod(config, command.meter)
  if (period === undefined) return unknownMeter
  if (!hasPeriod(period))
    return invalidRequest(`meter: ${command.meter} has no period (usage_history covers month and day meters)`)
  return [{ meter: command.meter, period }]
}

/**
 * Answers `usage_history` from memory (the current period, which may have changed since the store
 * was read) and `past`, the stored rows of earlier periods (newest first, at most `periods` per meter).
 */
export const usageHistory = (ctx: DecideContext, state: UserState, command: UsageHistoryCommand): Result => {
  const meters = usageHistoryMeters(ctx.config, command)
  if ("status" in meters) return meters
  // Read by the actor before deciding; a command decided without it is a bug, never an empty history.
  const past: ReadonlyArray<PeriodUsage> | undefined = command.past
  if (past === undefined) throw new Error("usage_history decided before its past periods were read")
  const history = meters.map(({ meter, period }): UsageHistoryEntry => {
    const current = meterAt(ctx.config, state, meter, ctx.now)
    const currentStart = current.periodStart ?? 0
    const oldest = periodStartBack(period, currentStart, command.periods - 1)
    const earlier = past.flatMap((row) =>
      row.meter === meter &&
      row.periodStart !== null &&
      row.periodStart < currentStart &&
      row.periodStart >= oldest &&
      row.used > 0
        ? [{ periodStart: row.periodStart, used: row.used }]
        : []
    )
    earlier.sort((a, b) => b.periodStart - a.periodStart)
    return { meter, period, periods: [{ periodStart: currentStart, used: current.used }, ...earlier] }
  })
  return { status: "ok", history }
}

/**
 * Checks a `list_usage` against the configuration at `now`: the meter is configured; a meter with a
 * period names the start of one of its periods, not later than the current one (on the clock of any
 * serving process: up to clockSkewMaxMs ahead); a `none` meter names none. null: it may be listed.
 */
export const refuseListUsage = (
  config: Config,
  command: ListUsageCommand,
  now: number
): UnknownMeterResult | InvalidRequestResult | null => {
  const period = meterPeriod(config, command.meter)
  if (period === undefined) return unknownMeter
  if (!hasPeriod(period)) {
    return command.periodStart === null
      ? null
      : invalidRequest(`periodStart: meter ${command.meter} has no period; leave periodStart out`)
  }
  if (command.periodStart === null) return invalidRequest("periodStart: required for a meter with a period")
  if (!isPeriodStart(period, command.periodStart))
    return invalidRequest(`periodStart: not the start of a ${period} (UTC)`)
  const latest = periodStartAt(period, now + clockSkewMaxMs(config)) ?? 0
  if (command.periodStart > latest) return invalidRequest("periodStart: later than the current period")
  return null
}
