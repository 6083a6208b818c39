/**
 * Past periods kept (PROTOCOL.md revision 1.3): at least the usagePeriodsKeptMin latest periods of every
 * meter, more by QUOTA_USAGE_PERIODS_KEPT. Older periods' usage rows and ledger rows are deleted in
 * bounded batches, once at start and then every usageRetentionIntervalMs, by every process (a delete of
 * what another process already deleted deletes nothing). One query per function.
 */
import { Effect } from "effect"
import type pg from "pg"
import type { Period } from "../../domain/config.js"
import { previousPeriodStart, periodStartAt } from "../../domain/period.js"
import { storeUnavailable } from "./errors.js"

/** Rows one delete statement removes at most; a larger backlog takes several (a lock held briefly). */
export const usageRetentionRowsPerDeleteMax = 10_000
/** How often the retention sweep runs. */
export const usageRetentionIntervalMs = 3_600_000

export interface UsageRetention {
  readonly meters: ReadonlyArray<{ readonly name: string; readonly period: Period }>
  /** Periods kept per meter, the current one included. */
  readonly periodsKept: number
}

const retentionStatements = (schema: string) => ({
  // period_start >= 0: a `none` meter's row (-1) is its current value, never past.
  deleteTotals: `
    delete from "${schema}".usage_totals where ctid = any(array(
      select ctid from "${schema}".usage_totals
      where meter = $1 and period_start >= 0 and period_start < $2 limit $3))`,
  deleteLedger: `
    delete from "${schema}".usage_ledger where ctid = any(array(
      select ctid from "${schema}".usage_ledger
      where meter = $1 and period_start >= 0 and period_start < $2 limit $3))`
})

/** The first period start kept of a meter at `now`: periodsKept periods counting the current one. */
export const oldestPeriodKept = (period: "month" | "day", periodsKept: number, now: number): number => {
  let start = periodStartAt(period, now) ?? 0
  for (let count = 1; count < periodsKept; count += 1) start = previousPeriodStart(period, start)
  return start
}

/** Deletes every meter's periods before the kept ones; returns the rows deleted. */
export const pruneUsagePeriods = (pool: pg.Pool, schema: string, retention: UsageRetention, now: number) =>
  Effect.tryPromise({
    try: async () => {
      const statements = retentionStatements(schema)
      let deleted = 0
      for (const { name, period } of retention.meters) {
        if (period === "none") continue
        const before = oldestPeriodKept(period, retention.periodsKept, now)
        for (const statement of [statements.deleteTotals, statements.deleteLedger]) {
          for (;;) {
            const result = await pool.query(statement, [name, before, usageRetentionRowsPerDeleteMax])
            deleted += result.rowCount ?? 0
            if ((result.rowCount ?? 0) < usageRetentionRowsPerDeleteMax) break
          }
        }
      }
      return deleted
    },
    catch: storeUnavailable("delete usage of periods past retention")
  })
