/**
 * Postgres unavailable: while the database cannot be reached, every command is answered `unavailable`
 * (never a grant), and when it returns the coordinator recovers by itself, with nothing granted during
 * the outage present in the database.
 */
import { Context, Effect, Layer } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import type { CoordinatorShape } from "../../src/actors/Coordinator.js"
import { Coordinator, coordinatorLayer } from "../../src/actors/Coordinator.js"
import { defaultConfig } from "../../src/domain/config.js"
import type { Result } from "../../src/domain/results.js"
import { checkpointAll } from "../../src/store/postgres/partitionLog.js"
import { postgresStoreLayer } from "../../src/store/postgres/PostgresStore.js"
import type { TestSchema } from "../support/database.js"
import { acquireScoped, createTestSchema, testDatabaseUrl } from "../support/database.js"
import type { TcpProxy } from "../support/tcpProxy.js"
import { startTcpProxy } from "../support/tcpProxy.js"

describe("Postgres outage", () => {
  let database: TestSchema
  let proxy: TcpProxy
  let coordinator: { value: CoordinatorShape; close: () => Promise<void> }

  beforeAll(async () => {
    database = createTestSchema("outage")
    const target = new URL(testDatabaseUrl)
    proxy = await startTcpProxy(target.hostname, Number(target.port || 5432))
    const viaProxy = new URL(testDatabaseUrl)
    viaProxy.host = `127.0.0.1:${proxy.port}`
    const layer = coordinatorLayer({ config: defaultConfig, sweepIntervalMs: 0, actorIdleMs: 60_000 }).pipe(
      Layer.provide(
        postgresStoreLayer({
          connectionString: viaProxy.toString(),
          schema: database.schema,
          prefix: "outage",
          partitions: 64
        })
      )
    )
    coordinator = await acquireScoped(
      Effect.gen(function* () {
        const context = yield* Layer.build(layer)
        return Context.get(context, Coordinator)
      })
    )
  })

  afterAll(async () => {
    await coordinator?.close()
    await proxy?.close()
    await database?.drop()
  })

  const submit = (command: Parameters<CoordinatorShape["submit"]>[0]): Promise<Result> =>
    Effect.runPromise(coordinator.value.submit(command))

  it("answers unavailable while Postgres is away, never a grant, and recovers when it returns", async () => {
    expect(
      (await submit({ op: "reserve", user: "u1", meter: "analysis", amount: 5, id: "before", ttlMs: 60_000 }))
        .status
    ).toBe("reserved")
    await proxy.cut()
    const during = await Promise.all(
      Array.from({ length: 20 }, (_, index) =>
        submit({
          op: "reserve",
          user: `u${index % 4}`,
          meter: "analysis",
          amount: 1,
          id: `during-${index}`,
          ttlMs: 60_000
        })
      )
    )
    expect(during.map((result) => result.status)).toEqual(during.map(() => "unavailable"))
    await proxy.restore()

    let recovered: Result | undefined
    for (let attempt = 0; attempt < 50; attempt += 1) {
      recovered = await submit({
        op: "reserve",
        user: "u1",
        meter: "analysis",
        amount: 5,
        id: "after",
        ttlMs: 60_000
      })
      if (recovered.status !== "unavailable") break
      await new Promise((resolve) => setTimeout(resolve, 100))
    }
    expect(recovered).toMatchObject({ status: "reserved", reserved: 10 })
    const pool = database.pool()
    // The tables are the log's checkpoint: brought up to date before they are read.
    await checkpointAll(pool, database.schema)
    const rows = await pool.query(`select id from "${database.schema}".holds order by id`)
    expect(rows.rows.map((row) => row.id)).toEqual(["after", "before"])
  }, 60_000)
})
