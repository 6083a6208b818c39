/**
 * Remembered ids through Postgres (issue 20, item 3). PROTOCOL.md: closed holds' ids and adjust ids
 * are remembered at least 7 days. Memory keeps a bounded window of them (closedHoldsPerUserMax) and a
 * load reads the newest loadRememberedIdsPerUserMax only; the store remembers the rest, and a command
 * naming an id memory does not hold is decided after the store was asked for it.
 */
import { Context, Effect, Layer } from "effect"
import pg from "pg"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import type { CoordinatorShape } from "../../src/actors/Coordinator.js"
import { Coordinator, coordinatorLayer } from "../../src/actors/Coordinator.js"
import type { Command } from "../../src/domain/commands.js"
import { defaultConfig } from "../../src/domain/config.js"
import { closedHoldsPerUserMax, loadRememberedIdsPerUserMax } from "../../src/domain/limits.js"
import { partitionOf } from "../../src/domain/partition.js"
import type { Result } from "../../src/domain/results.js"
import { Store } from "../../src/store/Store.js"
import type { StoreShape } from "../../src/store/Store.js"
import { checkpointAll } from "../../src/store/postgres/partitionLog.js"
import { postgresStoreLayer } from "../../src/store/postgres/PostgresStore.js"
import type { TestSchema } from "../support/database.js"
import { acquireScoped, createTestSchema } from "../support/database.js"
import { commitCommand, reserveCommand } from "../support/commands.js"
import { loadUser } from "../support/loadUser.js"

const partitions = 64
let database: TestSchema
let admin: pg.Pool
let system: { value: { coordinator: CoordinatorShape; store: StoreShape }; close: () => Promise<void> }

beforeAll(async () => {
  database = createTestSchema("remembered_ids")
  admin = database.pool({ max: 2 })
  const layer = coordinatorLayer({ config: defaultConfig, sweepIntervalMs: 0, actorIdleMs: 600_000 }).pipe(
    Layer.provideMerge(
      postgresStoreLayer({
        connectionString: database.connectionString,
        schema: database.schema,
        prefix: "remembered-ids",
        partitions
      })
    )
  )
  system = await acquireScoped(
    Effect.gen(function* () {
      const context = yield* Layer.build(layer)
      return { coordinator: Context.get(context, Coordinator), store: Context.get(context, Store) }
    })
  )
})

afterAll(async () => {
  await system?.close()
  await database?.drop()
})

const submit = (command: Command): Promise<Result> =>
  Effect.runPromise(system.value.coordinator.submit(command))
const table = (name: string) => `"${database.schema}".${name}`

/** `count` committed holds `<prefix><n>` of 1, closed one second apart, the newest a minute ago. */
const seedClosedHolds = async (user: string, prefix: string, count: number): Promise<void> => {
  const newest = Date.now() - 60_000
  await admin.query(
    `insert into ${table("holds")}
       (user_id, id, meter, amount, consumed, state, expires_at, created_at, closed_at, partition)
     select $1, $2 || n, 'analysis', 1, 1, 'committed', $3::bigint + 600000, $3::bigint - ($4::bigint - n) * 1000 - 10,
            $3::bigint - ($4::bigint - n) * 1000, $5
     from generate_series(0, $4::bigint - 1) as n`,
    [user, prefix, newest, count, partitionOf(user, partitions)]
  )
}

/** `count` adjust ids `<prefix><n>` of 1 in the ledger, one second apart, the newest a minute ago. */
const seedAdjustIds = async (user: string, prefix: string, count: number): Promise<void> => {
  const newest = Date.now() - 60_000
  await admin.query(
    `insert into ${table("usage_ledger")} (user_id, meter, period_start, operation, hold_id, key, requested, delta, at)
     select $1, 'storage_bytes', -1, 'adjust', null, $2 || n, 1, 1, $3::bigint - ($4::bigint - n) * 1000
     from generate_series(0, $4::bigint - 1) as n`,
    [user, prefix, newest, count]
  )
  await admin.query(
    `insert into ${table("usage_totals")} (user_id, meter, period_start, used) values ($1, 'storage_bytes', -1, $2)`,
    [user, count]
  )
}

const reserve = reserveCommand
const commit = commitCommand
const adjust = (user: string, id: string): Command => ({
  op: "adjust",
  user,
  meter: "storage_bytes",
  amount: 1,
  id
})

describe("remembered ids", () => {
  it("a retry of an id memory forgot past its cap is answered from the store: closed, never charged again", async () => {
    const user = "heavy-holds"
    await seedClosedHolds(user, "old-", closedHoldsPerUserMax)
    // One more hold closes: memory's cap forgets the oldest, old-0.
    expect((await submit(reserve(user, "new-1"))).status).toBe("reserved")
    expect((await submit(commit(user, "new-1"))).status).toBe("committed")
    const retried = await submit(reserve(user, "old-0"))
    expect(retried).toMatchObject({ status: "closed", id: "old-0", state: "committed" })
    expect(await submit(commit(user, "old-0"))).toMatchObject({ status: "exists", state: "committed" })
    // The tables are the log's checkpoint: brought up to date before they are read.
    await checkpointAll(admin, database.schema)
    const ledger = await admin.query(
      `select count(*)::int as rows from ${table("usage_ledger")} where user_id = $1`,
      [user]
    )
    expect(ledger.rows[0].rows).toBe(1)
  }, 60_000)

  it("loads the newest ids only, in bounded rows, and recalls an older one when a command names it", async () => {
    const user = "heavy-adjusts"
    await seedAdjustIds(user, "a-", loadRememberedIdsPerUserMax + 5_000)
    await seedClosedHolds(user, "h-", loadRememberedIdsPerUserMax + 5_000)
    const startedAt = performance.now()
    const stored = await Effect.runPromise(loadUser(system.value.store, user, Date.now()))
    const loadMs = performance.now() - startedAt
    console.log(
      `load of a user with ${2 * (loadRememberedIdsPerUserMax + 5_000)} remembered ids: ${loadMs.toFixed(0)} ms`
    )
    expect(stored.holds.length).toBe(loadRememberedIdsPerUserMax)
    expect(stored.adjustments.length).toBe(loadRememberedIdsPerUserMax)
    expect(stored.idsTruncated).toBe(true)
    // The oldest of each is not in memory: answered from the store.
    expect(await submit(adjust(user, "a-0"))).toMatchObject({ status: "exists", id: "a-0" })
    expect(await submit(reserve(user, "h-0"))).toMatchObject({ status: "closed", id: "h-0" })
    // A new id is new.
    expect((await submit(adjust(user, "a-new"))).status).toBe("adjusted")
  }, 60_000)
})
