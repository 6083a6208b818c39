/**
 * Migration 0005: identifiers written before U+0000 was allowed are read back as they were written.
 * Such rows were stored as they are, and one of them could start with U+FFFF, the marker of an escaped
 * identifier (src/store/postgres/storedText.ts); the migration rewrites those into the escaped form.
 */
import { Effect } from "effect"
import { afterAll, describe, expect, it } from "vitest"
import { partitionOf } from "../../src/domain/partition.js"
import { makePostgresStore } from "../../src/store/postgres/PostgresStore.js"
import { migrate, readMigrations } from "../../src/store/postgres/migrate.js"
import { acquireScoped, createTestSchema } from "../support/database.js"
import { loadUser } from "../support/loadUser.js"

const database = createTestSchema("escaped_ids")
afterAll(() => database.drop())

const partitions = 16
const now = Date.UTC(2026, 10, 15, 12)
const month = Date.UTC(2026, 10, 1)

/** Rows as the code before migration 0005 wrote them for `user`: every identifier as it is. */
const writeLegacyRows = async (schema: string, user: string, prefix: string): Promise<void> => {
  const pool = database.pool({ max: 1 })
  const partition = partitionOf(user, partitions)
  const at = now - 1_000
  await pool.query(
    `insert into "${schema}".holds
       (user_id, id, meter, amount, consumed, state, expires_at, created_at, closed_at, partition)
     values ($1, $2, 'analysis', 10, 3, 'pending', $3, $4, null, $5)`,
    [user, `${prefix}hold\\1`, now + 3_600_000, at, partition]
  )
  await pool.query(
    `insert into "${schema}".usage_ledger (user_id, meter, period_start, operation, hold_id, key, requested, delta, at)
     values ($1, 'analysis', $2, 'consume', $3, $4, 3, 3, $5),
            ($1, 'analysis', $2, 'adjust', null, $6, 4, 4, $5)`,
    [user, month, `${prefix}hold\\1`, `${prefix}key`, at, `${prefix}adjust`]
  )
  await pool.query(
    `insert into "${schema}".usage_totals (user_id, meter, period_start, used) values ($1, 'analysis', $2, 7)`,
    [user, month]
  )
  await pool.query(`insert into "${schema}".user_plans (user_id, plan) values ($1, 'pro')`, [user])
  await pool.query(
    `insert into "${schema}".user_limits (user_id, meter, limit_value) values ($1, 'tokens', 5)`,
    [user]
  )
  await pool.query(
    `insert into "${schema}".slots (user_id, job, lease_expires_at, partition) values ($1, $2, $3, $4)`,
    [user, `${prefix}job`, now + 60_000, partition]
  )
}

describe("migration 0005: identifiers written before it", () => {
  it("loads users, hold ids, consume keys, adjust ids and jobs that start with U+FFFF as written", async () => {
    const schema = database.freshSchema("legacy")
    const pool = database.pool()
    const migrations = await Effect.runPromise(readMigrations())
    const before = migrations.filter((migration) => migration.version < 5)
    await Effect.runPromise(migrate(pool, schema, before))

    const markedUser = "\uffffold\\user"
    const plainUser = "plain \\ user"
    await writeLegacyRows(schema, markedUser, "\uffff")
    await writeLegacyRows(schema, plainUser, "")
    // 0005 and whatever came after it.
    expect((await Effect.runPromise(migrate(pool, schema))).applied[0]).toBe(5)

    const opened = await acquireScoped(makePostgresStore({ pool, schema, partitions }))
    try {
      for (const [user, prefix] of [
        [markedUser, "\uffff"],
        [plainUser, ""]
      ] as const) {
        const loaded = await Effect.runPromise(loadUser(opened.value, user, now))
        expect(loaded.plan).toBe("pro")
        expect(loaded.limitOverrides).toEqual([{ meter: "tokens", limit: 5 }])
        expect(loaded.usage).toEqual([
          { meter: "analysis", periodStart: month, used: 7, thresholdsCrossed: [] }
        ])
        expect(loaded.holds.map((hold) => [hold.id, hold.consumeKeys])).toEqual([
          [`${prefix}hold\\1`, [`${prefix}key`]]
        ])
        expect(loaded.adjustments.map((adjustment) => adjustment.id)).toEqual([`${prefix}adjust`])
        expect(loaded.slots.map((slot) => slot.job)).toEqual([`${prefix}job`])
      }
      const due = await Effect.runPromise(opened.value.usersWithExpiries(now + 7_200_000, 100))
      expect([...due].sort()).toEqual([markedUser, plainUser].sort())
    } finally {
      await opened.close()
    }
  })
})
