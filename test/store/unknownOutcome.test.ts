/**
 * A write whose outcome is unknown must never let memory run behind the database (issue 19, item 1).
 * A group's COMMIT outlasts the store's query timeout (here a deferred trigger sleeps in COMMIT, as a
 * lost synchronous replica or a storage stall would): the client gives up and answers `unavailable`,
 * but the server may still commit. The actor reloads; if it read before that commit landed, its
 * memory is behind, and its later whole-row writes overwrite what landed. Replays the case:
 * reserve 1, 10, 20; commit 1; commit 10 (times out); commit 20; the retried commit of 10; then a
 * reserve that fits only if the 10 was lost.
 */
import { Context, Effect, Layer } from "effect"
import pg from "pg"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import type { CoordinatorShape } from "../../src/actors/Coordinator.js"
import { Coordinator, coordinatorLayer } from "../../src/actors/Coordinator.js"
import type { Command } from "../../src/domain/commands.js"
import { defaultConfig } from "../../src/domain/config.js"
import type { Result } from "../../src/domain/results.js"
import { postgresStoreLayer } from "../../src/store/postgres/PostgresStore.js"
import type { TestSchema } from "../support/database.js"
import { commitCommand, reserveCommand, retryingUnavailable } from "../support/commands.js"
import { acquireScoped, createTestSchema } from "../support/database.js"
import { slowFirstCommitOfH10 } from "../support/slowCommit.js"
import { checkpointAll } from "../../src/store/postgres/partitionLog.js"

const queryTimeoutMs = 1_000
/** Longer than the query timeout: the client gives up while the server is still inside COMMIT. */
const commitSleepMs = 2_500

describe("a write whose outcome is unknown", () => {
  let database: TestSchema
  let admin: pg.Pool
  let coordinator: { value: CoordinatorShape; close: () => Promise<void> }

  beforeAll(async () => {
    database = createTestSchema("unknown_outcome")
    admin = database.pool({ max: 2 })
    const layer = coordinatorLayer({ config: defaultConfig, sweepIntervalMs: 0, actorIdleMs: 60_000 }).pipe(
      Layer.provide(
        postgresStoreLayer({
          connectionString: database.connectionString,
          schema: database.schema,
          prefix: "unknown-outcome",
          partitions: 64,
          queryTimeoutMs
        })
      )
    )
    coordinator = await acquireScoped(
      Effect.gen(function* () {
        const context = yield* Layer.build(layer)
        return Context.get(context, Coordinator)
      })
    )
    // The first commit of hold h10 sleeps in COMMIT; a retry of the same commit does not sleep again.
    await slowFirstCommitOfH10(admin, database.schema, ["u1"], `pg_sleep(${commitSleepMs / 1_000})`)
  })

  afterAll(async () => {
    await coordinator?.close()
    await database?.drop()
  })

  const submit = (command: Command): Promise<Result> => Effect.runPromise(coordinator.value.submit(command))
  const submitRetrying = retryingUnavailable(submit)
  const reserve = (id: string, amount: number): Command => reserveCommand("u1", id, amount)
  const commit = (id: string): Command => commitCommand("u1", id)

  it("never grants past the limit, and the running total stays the ledger's sum", async () => {
    for (const [id, amount] of [
      ["h1", 1],
      ["h10", 10],
      ["h20", 20]
    ] as const)
      expect((await submit(reserve(id, amount))).status).toBe("reserved")
    expect((await submit(commit("h1"))).status).toBe("committed")
    // The client gives up after the query timeout; the server is still in COMMIT.
    expect((await submit(commit("h10"))).status).toBe("unavailable")
    // Whatever the server was still doing has finished (it held the usage row's lock meanwhile).
    await new Promise((resolve) => setTimeout(resolve, commitSleepMs))
    expect((await submit(commit("h20"))).status).toBe("committed")

    // The retry of the commit whose outcome was unknown: counted exactly once, whichever way it went.
    const retried = await submitRetrying(commit("h10"))
    expect(["committed", "exists"]).toContain(retried.status)
    expect(retried).toMatchObject({ used: 31, reserved: 0 })

    // 31 used of 5 000: 4 979 more would be 5 010.
    const tooMuch = await submitRetrying(reserve("big", 4_979))
    expect(tooMuch).toMatchObject({ status: "insufficient_quota", used: 31 })

    // The tables are the log's checkpoint: brought up to date before they are read.
    await checkpointAll(admin, database.schema)
    const schema = `"${database.schema}"`
    const totals = await admin.query<{ used: string }>(
      `select used::text from ${schema}.usage_totals where user_id = 'u1' and meter = 'analysis'`
    )
    const ledger = await admin.query<{ total: string }>(
      `select sum(delta)::text as total from ${schema}.usage_ledger where user_id = 'u1' and meter = 'analysis'`
    )
    expect({ totals: totals.rows.map((row) => row.used), ledger: ledger.rows[0]?.total }).toEqual({
      totals: ["31"],
      ledger: "31"
    })
  }, 30_000)
})
