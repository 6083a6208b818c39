/**
 * Past periods kept (PROTOCOL.md revision 1.3): at least the usagePeriodsKeptMin latest periods of every
 * meter, more by QUOTA_USAGE_PERIODS_KEPT. Older periods' usage rows and ledger rows are deleted in
 * bounded batches, once at start and then every usageRetentionIntervalMs, by every process (a delete of
 * what another process already deleted deletes nothing). One query per function.
 */
import { Effect } from "effect"
import type pg from "pg"
import type { Period } from "../../domain/config.js"
import { periodStartAt, periodStartBack } from "../../domain/period.js"
import { storeUnavailable } from "./errors.js"

/** Usage rows one delete statement removes at most (with their ledger rows); a larger backlog takes several. */
export const usageRetentionRowsPerDeleteMax = 10_000
/** How often the retention sweep runs. */
export const usageRetentionIntervalMs = 3_600_000

export interface UsageRetention {
  readonly meters: ReadonlyArray<{ readonly name: string; readonly period: Period }>
  /** Periods kept per meter, the current one included. */
  readonly periodsKept: number
}

const retentionStatements = (schema: string) => ({
  // period_start >= 0: a `none` meter's row (-1) is its current value, never past. A batch of usage
  // rows, and with them the ledger rows they sum (every ledger row has its usage row, written in the
  // same group), found by user: the ledger has no index by meter or period, and one would cost every
  // charge a write.
  deleteBatch: `
    with totals as (
      delete from "${schema}".usage_totals where ctid = any(array(
        select ctid from "${schema}".usage_totals
        where meter = $1 and period_start >= 0 and period_start < $2 limit $3))
      returning user_id, meter, period_start
    ), ledger as (
      delete from "${schema}".usage_ledger as entry using totals
      where entry.user_id = totals.user_id and entry.meter = totals.meter
        and entry.period_start = totals.period_start
      returning 1
    )
    select (select count(*) from totals)::integer as totals, (select count(*) from ledger)::integer as ledger`
})

/** The first period start kept of a meter at `now`: periodsKept periods counting the current one. */
export const oldestPeriodKept = (period: "month" | "day", periodsKept: number, now: number): number =>
  periodStartBack(period, periodStartAt(period, now) ?? 0, periodsKept - 1)

/** Deletes every meter's periods before the kept ones; returns the rows deleted. */
export const pruneUsagePeriods = (pool: pg.Pool, schema: string, retention: UsageRetention, now: number) =>
  Effect.tryPromise({
    try: async () => {
      const statements = retentionStatements(schema)
      let deleted = 0
      for (const { name, period } of retention.meters) {
        if (period === "none") continue
        const before = oldestPeriodKept(period, retention.periodsKept, now)
        for (;;) {
          const result = await pool.query<{ totals: number; ledger: number }>(statements.deleteBatch, [
            name,
            before,
            usageRetentionRowsPerDeleteMax
          ])
          const { totals, ledger } = result.rows[0]!
          deleted += totals + ledger
          if (totals < usageRetentionRowsPerDeleteMax) break
        }
      }
      return deleted
    },
    catch: storeUnavailable("delete usage of periods past retention")
  })
