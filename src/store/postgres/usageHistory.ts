/** Past periods' usage (PROTOCOL.md revision 1.3, migration 0009): one query per function. */
import { Effect } from "effect"
import type pg from "pg"
import type { PeriodUsage } from "../../domain/events.js"
import type { StoreUnavailable, UsageListPage, UsageListQuery } from "../Store.js"
import { toSafeInteger, toSafeIntegerOrNull } from "./bigints.js"
import { storeUnavailable } from "./errors.js"
import type { SettledRead } from "./outcomeDoubts.js"
import { fromStoredText, toStoredText } from "./storedText.js"
import { periodNoneSentinel, storedPeriodStart } from "./writeEvents.js"

const usageHistoryStatements = (schema: string) => ({
  // Per meter, the newest periods first: the primary key (user_id, meter, period_start) read backwards.
  pastUsage: `
    select wanted.meter, nullif(past.period_start, ${periodNoneSentinel})::text as period_start,
           past.used::text as used
    from unnest($2::text[]) with ordinality as wanted (meter, position)
    cross join lateral (
      select period_start, used from "${schema}".usage_totals as totals
      where totals.user_id = $1 and totals.meter = wanted.meter and totals.used > 0
      order by totals.period_start desc limit $3
    ) as past
    order by wanted.position, past.period_start desc`,
  // The index usage_totals_partition_listing, in the order of the users' UTF-8 bytes (which
  // identifier_bytes gives back for escaped ids too). One row past the limit says whether there are more.
  listUsage: `
    select user_id, used::text as used from "${schema}".usage_totals
    where meter = $1 and period_start = $2 and partition = $3
      and "${schema}".identifier_bytes(user_id) > $4::bytea and used > 0
    order by "${schema}".identifier_bytes(user_id)
    limit $5`
})

/** `readSettled`: the store's (outcomeDoubts.ts), so an answer rests on what the standby has too. */
export const makeUsageHistory = (pool: pg.Pool, schema: string, readSettled: SettledRead) => {
  const statements = usageHistoryStatements(schema)
  return {
    pastUsage: (
      user: string,
      meters: ReadonlyArray<string>,
      periodsMax: number
    ): Effect.Effect<ReadonlyArray<PeriodUsage>, StoreUnavailable> =>
      Effect.tryPromise({
        try: async () => {
          const result = await readSettled(() =>
            pool.query<{ meter: string; period_start: string | null; used: string }>(statements.pastUsage, [
              toStoredText(user),
              meters,
              periodsMax
            ])
          )
          return result.rows.map((row): PeriodUsage => ({
            meter: row.meter,
            periodStart: toSafeIntegerOrNull(row.period_start),
            used: toSafeInteger(row.used)
          }))
        },
        catch: storeUnavailable(`read past usage of user ${JSON.stringify(user)}`)
      }),
    listUsage: (query: UsageListQuery): Effect.Effect<UsageListPage, StoreUnavailable> =>
      Effect.tryPromise({
        try: async () => {
          const result = await readSettled(() =>
            pool.query<{ user_id: string; used: string }>(statements.listUsage, [
              query.meter,
              storedPeriodStart(query.periodStart),
              query.partition,
              Buffer.from(query.after ?? "", "utf8"),
              query.limit + 1
            ])
          )
          const rows = result.rows.slice(0, query.limit)
          return {
            usage: rows.map((row) => ({ user: fromStoredText(row.user_id), used: toSafeInteger(row.used) })),
            more: result.rows.length > query.limit
          }
        },
        catch: storeUnavailable(`list usage of partition ${query.partition}`)
      })
  }
}
