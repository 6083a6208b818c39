/**
 * Past periods kept (PROTOCOL.md revision 1.3: at least the 36 latest periods of every meter): the
 * retention sweep deletes the usage rows and ledger rows of older periods of month and day meters,
 * keeps every kept period and every `none` meter's row, and works through more rows than one delete
 * statement takes.
 */
import { Effect } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { migrate } from "../../src/store/postgres/migrate.js"
import { oldestPeriodKept, pruneUsagePeriods } from "../../src/store/postgres/usageRetention.js"
import type { TestSchema } from "../support/database.js"
import { createTestSchema } from "../support/database.js"

let test: TestSchema
const now = Date.UTC(2026, 10, 27, 12)

beforeAll(async () => {
  test = createTestSchema("retention")
  await Effect.runPromise(migrate(test.pool(), test.schema))
})

afterAll(async () => {
  await test?.drop()
})

const monthsBack = (count: number): number => Date.UTC(2026, 10 - count, 1)
const daysBack = (count: number): number => Date.UTC(2026, 10, 27) - count * 86_400_000

const seed = async (
  rows: ReadonlyArray<{ user: string; meter: string; periodStart: number; used: number }>
) => {
  const pool = test.pool()
  await pool.query(
    `insert into "${test.schema}".usage_totals (user_id, meter, period_start, used, partition)
     select * from unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[], $5::integer[])`,
    [
      rows.map((row) => row.user),
      rows.map((row) => row.meter),
      rows.map((row) => row.periodStart),
      rows.map((row) => row.used),
      rows.map(() => 0)
    ]
  )
  await pool.query(
    `insert into "${test.schema}".usage_ledger (user_id, meter, period_start, operation, hold_id, key, requested, delta, at)
     select user_id, meter, period_start, 'adjust', null, meter || period_start, used, used, period_start
     from unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[]) as row (user_id, meter, period_start, used)`,
    [
      rows.map((row) => row.user),
      rows.map((row) => row.meter),
      rows.map((row) => row.periodStart),
      rows.map((row) => row.used)
    ]
  )
}

const periodsOf = async (table: "usage_totals" | "usage_ledger", meter: string): Promise<Array<number>> =>
  (
    await test
      .pool()
      .query<{ period_start: string }>(
        `select distinct period_start::text from "${test.schema}".${table} where meter = $1 order by 1`,
        [meter]
      )
  ).rows
    .map((row) => Number(row.period_start))
    .sort((a, b) => a - b)

describe("the retention sweep of past periods", () => {
  it("the oldest period kept counts the current one", () => {
    expect(oldestPeriodKept("month", 36, now)).toBe(monthsBack(35))
    expect(oldestPeriodKept("month", 1, now)).toBe(monthsBack(0))
    expect(oldestPeriodKept("day", 36, now)).toBe(daysBack(35))
  })

  it("deletes periods older than the 36 kept, of month and day meters, never a none meter's row", async () => {
    const months = Array.from({ length: 40 }, (_, index) => monthsBack(index))
    const days = Array.from({ length: 40 }, (_, index) => daysBack(index))
    await seed([
      ...months.map((periodStart) => ({ user: "ret-a", meter: "analysis", periodStart, used: 3 })),
      ...days.map((periodStart) => ({ user: "ret-a", meter: "daily", periodStart, used: 2 })),
      { user: "ret-a", meter: "storage_bytes", periodStart: -1, used: 9 }
    ])
    const retention = {
      meters: [
        { name: "analysis", period: "month" as const },
        { name: "daily", period: "day" as const },
        { name: "storage_bytes", period: "none" as const }
      ],
      periodsKept: 36
    }
    const deleted = await Effect.runPromise(pruneUsagePeriods(test.pool(), test.schema, retention, now))
    // 4 months and 4 days too old, each a usage row and a ledger row.
    expect(deleted).toBe(16)
    for (const table of ["usage_totals", "usage_ledger"] as const) {
      expect(await periodsOf(table, "analysis")).toEqual(months.slice(0, 36).sort((a, b) => a - b))
      expect(await periodsOf(table, "daily")).toEqual(days.slice(0, 36).sort((a, b) => a - b))
      expect(await periodsOf(table, "storage_bytes")).toEqual([-1])
    }
    // Longer by the setting: nothing more goes.
    const longer = await Effect.runPromise(
      pruneUsagePeriods(test.pool(), test.schema, { ...retention, periodsKept: 120 }, now)
    )
    expect(longer).toBe(0)
  })

  it("works through more rows than one statement deletes (10 000)", async () => {
    const users = Array.from({ length: 12_000 }, (_, index) => `ret-many-${index}`)
    await seed(users.map((user) => ({ user, meter: "tokens", periodStart: monthsBack(50), used: 1 })))
    const deleted = await Effect.runPromise(
      pruneUsagePeriods(
        test.pool(),
        test.schema,
        { meters: [{ name: "tokens", period: "month" }], periodsKept: 36 },
        now
      )
    )
    expect(deleted).toBe(24_000)
    expect(await periodsOf("usage_totals", "tokens")).toEqual([])
  })
})
