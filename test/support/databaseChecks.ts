/**
 * What Postgres itself must satisfy after a crash or failover: the invariant per user and meter (in the
 * current month, for the default configuration's month and `none` meters), every acknowledged grant and
 * charge present, no idempotency key applied twice, totals equal to the ledger.
 */
import type pg from "pg"
import { checkpointAll } from "../../src/store/postgres/partitionLog.js"

/**
 * A `serve` database's tables brought up to its partitions' logs: the tables are the logs' checkpoint,
 * and what a check reads must hold every acknowledged change. The owners' own checkpoints run
 * meanwhile; none projects a row twice (src/store/postgres/partitionLog.ts).
 */
export const tablesUpToDate = (pool: pg.Pool): Promise<number> => checkpointAll(pool, "quota")

export interface AcknowledgedWrites {
  readonly holds: ReadonlyMap<string, { user: string; id: string; amount: number }>
  readonly commits: ReadonlyMap<string, { user: string; id: string; amount: number }>
  readonly releases: ReadonlyMap<string, { user: string; id: string }>
  readonly adjustments: ReadonlyMap<string, { user: string; id: string }>
}

export interface DatabaseReport {
  readonly checked: number
  readonly violations: ReadonlyArray<string>
}

export const checkDatabase = async (
  pool: pg.Pool,
  acknowledged: AcknowledgedWrites
): Promise<DatabaseReport> => {
  await tablesUpToDate(pool)
  const violations: Array<string> = []
  const overLimit = await pool.query<{
    user_id: string
    meter: string
    used: string
    reserved: string
    limit_value: string
  }>(`
    with current_period as (
      -- The newest month a serving clock can be in (clocks within the bound, 2 s covers it): a user
      -- with no row of it has used nothing in it, whatever its last period's row holds (its pending
      -- holds carry over a month's end, its usage does not).
      select (extract(epoch from date_trunc('month', (clock_timestamp() + interval '2 seconds') at time zone 'UTC'))
              * 1000)::bigint as month_start
    ), latest as (
      select distinct on (user_id, meter) user_id, meter, used from quota.usage_totals, current_period
      where period_start = -1 or period_start >= current_period.month_start
      order by user_id, meter, period_start desc
    ), reserved as (
      select user_id, meter, sum(greatest(amount - consumed, 0)) as reserved from quota.holds
      where state = 'pending' group by user_id, meter
    )
    select l.user_id, l.meter, coalesce(u.used, 0)::text as used, coalesce(r.reserved, 0)::text as reserved,
           l.limit_value::text
    from quota.user_limits l
    left join latest u using (user_id, meter)
    left join reserved r using (user_id, meter)
    where coalesce(u.used, 0) + coalesce(r.reserved, 0) > l.limit_value`)
  for (const row of overLimit.rows) {
    violations.push(
      `${row.user_id}/${row.meter}: used ${row.used} + reserved ${row.reserved} > limit ${row.limit_value}`
    )
  }
  const duplicates = await pool.query<{
    user_id: string
    operation: string
    hold_id: string
    key: string
    count: string
  }>(`
    select user_id, operation, coalesce(hold_id, '') as hold_id, key, count(*)::text as count
    from quota.usage_ledger group by 1, 2, 3, 4 having count(*) > 1`)
  for (const row of duplicates.rows) {
    violations.push(
      `ledger key applied ${row.count} times: ${row.user_id} ${row.operation} ${row.hold_id} ${row.key}`
    )
  }
  const mismatched = await pool.query<{ user_id: string; meter: string }>(`
    with ledger as (
      select user_id, meter, period_start, sum(delta) as total from quota.usage_ledger group by 1, 2, 3
    )
    select user_id, meter from quota.usage_totals t full join ledger using (user_id, meter, period_start)
    where coalesce(t.used, 0) <> coalesce(ledger.total, 0)`)
  for (const row of mismatched.rows)
    violations.push(`usage total differs from ledger: ${row.user_id}/${row.meter}`)

  const holds = await pool.query<{
    user_id: string
    id: string
    amount: string
    consumed: string
    state: string
  }>("select user_id, id, amount::text, consumed::text, state from quota.holds")
  const holdByKey = new Map(holds.rows.map((row) => [`${row.user_id}/${row.id}`, row]))
  let checked = 0
  for (const [key, hold] of acknowledged.holds) {
    checked += 1
    const row = holdByKey.get(key)
    if (row === undefined) violations.push(`acknowledged hold missing: ${key}`)
    else if (Number(row.amount) !== hold.amount)
      violations.push(`hold ${key}: amount ${row.amount}, acknowledged ${hold.amount}`)
  }
  for (const [key, commit] of acknowledged.commits) {
    checked += 1
    const row = holdByKey.get(key)
    if (row?.state !== "committed" || Number(row.consumed) !== commit.amount) {
      violations.push(`acknowledged commit ${key} of ${commit.amount} not durable: ${JSON.stringify(row)}`)
    }
  }
  for (const [key] of acknowledged.releases) {
    checked += 1
    if (holdByKey.get(key)?.state !== "released") violations.push(`acknowledged release ${key} not durable`)
  }
  const adjustments = await pool.query<{ user_id: string; key: string }>(
    "select user_id, key from quota.usage_ledger where operation = 'adjust'"
  )
  const adjusted = new Set(adjustments.rows.map((row) => `${row.user_id}/${row.key}`))
  for (const key of acknowledged.adjustments.keys()) {
    checked += 1
    if (!adjusted.has(key)) violations.push(`acknowledged adjust ${key} missing`)
  }
  return { checked, violations }
}
