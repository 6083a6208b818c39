/**
 * The orphan sweep: holds past expiresAt and slot leases past their end are expired even for users
 * with no resident actor, through the user's actor (one writer), exactly once.
 */
import { Context, Effect, Layer } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import type { CoordinatorShape } from "../../src/actors/Coordinator.js"
import { Coordinator, coordinatorLayer } from "../../src/actors/Coordinator.js"
import { defaultConfig } from "../../src/domain/config.js"
import { checkpointAll } from "../../src/store/postgres/partitionLog.js"
import { postgresStoreLayer } from "../../src/store/postgres/PostgresStore.js"
import type { TestSchema } from "../support/database.js"
import { acquireScoped, createTestSchema } from "../support/database.js"

describe("orphan sweep over Postgres", () => {
  let database: TestSchema
  let coordinator: { value: CoordinatorShape; close: () => Promise<void> }

  beforeAll(async () => {
    database = createTestSchema("sweep")
    const layer = coordinatorLayer({ config: defaultConfig, sweepIntervalMs: 0 }).pipe(
      Layer.provide(
        postgresStoreLayer({
          connectionString: database.connectionString,
          schema: database.schema,
          prefix: "sweep",
          partitions: 64
        })
      )
    )
    coordinator = await acquireScoped(
      Effect.map(Layer.build(layer), (context) => Context.get(context, Coordinator))
    )
  })

  afterAll(async () => {
    await coordinator?.close()
    await database?.drop()
  })

  it("expires a non-resident user's due hold and lease once, and returns the hold's rest", async () => {
    const run = <A>(effect: Effect.Effect<A>) => Effect.runPromise(effect)
    const { submit, dropAllActors, sweepOnce, residentActors } = coordinator.value
    expect(
      (
        await run(
          submit({ op: "reserve", user: "gone", meter: "tokens", amount: 500, id: "h", ttlMs: 1_000 })
        )
      ).status
    ).toBe("reserved")
    expect(
      (await run(submit({ op: "acquire_slot", user: "gone", job: "j", leaseMs: 1_000, waitMs: 0 }))).status
    ).toBe("acquired")
    await run(dropAllActors)
    expect(residentActors()).toBe(0)
    expect(await run(sweepOnce)).toBe(0)
    await new Promise((resolve) => setTimeout(resolve, 1_100))

    expect(await run(sweepOnce)).toBe(1)
    const pool = database.pool()
    // The tables are the log's checkpoint: brought up to date before they are read.
    await checkpointAll(pool, database.schema)
    const holds = await pool.query(
      `select state, closed_at is not null as closed from "${database.schema}".holds`
    )
    expect(holds.rows).toEqual([{ state: "expired", closed: true }])
    const slots = await pool.query(`select count(*)::int as count from "${database.schema}".slots`)
    expect(slots.rows[0].count).toBe(0)
    expect(await run(sweepOnce)).toBe(0)

    const usage = await run(submit({ op: "get_usage", user: "gone" }))
    expect(usage).toMatchObject({ status: "ok", slots: { held: 0 } })
    if (usage.status === "ok" && "meters" in usage) {
      expect(usage.meters.find((meter) => meter.meter === "tokens")).toMatchObject({
        reserved: 0,
        used: 0,
        pendingHolds: 0
      })
    }
  })
})
