/**
 * Fencing by epoch: a write succeeds only while this process's epochs are the partitions' current
 * ones, checked in the write's own transaction; a superseded process fails and is told which partitions
 * it lost. A write is fenced with the epoch it was decided under (issue 26, item 2). Both the pipelined
 * and the one-statement-at-a-time paths.
 */
import { Effect, Result } from "effect"
import pg from "pg"
import { afterAll, describe, expect, it } from "vitest"
import type { StoreEvent } from "../../src/domain/events.js"
import { partitionOf } from "../../src/domain/partition.js"
import type { Fence, FencedEpoch } from "../../src/store/Fence.js"
import { migrate } from "../../src/store/postgres/migrate.js"
import { makeOwnershipQueries } from "../../src/store/postgres/ownership.js"
import { checkpointAll } from "../../src/store/postgres/partitionLog.js"
import { makePostgresStore } from "../../src/store/postgres/PostgresStore.js"
import { makePrometheusMetrics } from "../../src/ops/PrometheusMetrics.js"
import { acquireScoped, createTestSchema } from "../support/database.js"
import { parseMetrics, sample } from "../support/operations.js"

const database = createTestSchema("fence")
afterAll(() => database.drop())

const partitions = 8
const now = 1_790_000_000_000

const holdEvent = (user: string, id: string): StoreEvent => ({
  kind: "hold",
  user,
  hold: {
    id,
    meter: "analysis",
    amount: 1,
    consumed: 0,
    state: "pending",
    expiresAt: now + 60_000,
    createdAt: now,
    closedAt: null
  }
})

describe.each([false, true])("fenced writes (pipelined: %s)", (pipelined) => {
  it("writes while the epoch is ours, fails and reports the lost partition once it is claimed", async () => {
    const schema = database.freshSchema(pipelined ? "piped" : "plain")
    const pool = new pg.Pool({ connectionString: database.connectionString, max: 2, pipeline: pipelined })
    pool.on("error", () => {})
    await Effect.runPromise(migrate(pool, schema))
    const user = `fenced-user-${pipelined}`
    const partition = partitionOf(user, partitions)
    await pool.query(
      `insert into "${schema}".partition_owners (partition, owner, epoch, lease_expires_at) values ($1, 'me', 1, 0)`,
      [partition]
    )
    const epochs = new Map([[partition, 1]])
    const lost: Array<FencedEpoch> = []
    const fence: Fence = {
      owner: "me",
      epochOf: (candidate) => epochs.get(candidate),
      superseded: (partitionsLost) => lost.push(...partitionsLost)
    }
    const metrics = makePrometheusMetrics({ meters: ["analysis"], plans: ["free"], processMetrics: false })
    const opened = await acquireScoped(
      makePostgresStore({ pool, schema, partitions, fence, pipelined, metrics: metrics.recorder })
    )

    // Appends to the partition's log, as its actor makes them (positions 1, 2, 3).
    const append = (id: string, position: number) =>
      Effect.runPromise(
        Effect.result(
          opened.value.write([holdEvent(user, id)], { partition, epoch: 1, position, token: "t" })
        )
      )
    expect(Result.isSuccess(await append("first", 1))).toBe(true)
    // Another process claims the partition: the epoch moves on.
    await pool.query(
      `update "${schema}".partition_owners set owner = 'other', epoch = 2 where partition = $1`,
      [partition]
    )
    const refused = await append("second", 2)
    expect(Result.isFailure(refused) && refused.failure._tag === "StoreUnavailable").toBe(true)
    // Told with the epoch the refused write was fenced with.
    expect(lost).toEqual([{ partition, epoch: 1 }])
    // A partition this process never held is refused before any SQL.
    epochs.clear()
    const unowned = await append("third", 3)
    expect(Result.isFailure(unowned)).toBe(true)
    await checkpointAll(pool, schema)
    const rows = await pool.query(`select id from "${schema}".holds order by id`)
    expect(rows.rows.map((row) => row.id)).toEqual(["first"])
    // The store counts what the fence refused, where it refused it: both refusals, and three commits.
    const counted = parseMetrics((await metrics.scrape()).body)
    expect(sample(counted, "quota_fenced_writes_total")).toBe(2)
    expect(sample(counted, "quota_store_commit_duration_seconds_count")).toBe(3)
    expect(sample(counted, "quota_store_commits_failed_total")).toBe(2)
    await opened.close()
    await pool.end()
  })

  it("fences a write with the epoch it was decided under, not the one held when its group starts", async () => {
    const schema = database.freshSchema(pipelined ? "decided_piped" : "decided_plain")
    const pool = new pg.Pool({ connectionString: database.connectionString, max: 2, pipeline: pipelined })
    pool.on("error", () => {})
    await Effect.runPromise(migrate(pool, schema))
    const user = `decided-user-${pipelined}`
    const partition = partitionOf(user, partitions)
    // Lost and claimed again: this process holds the partition under epoch 3 now, in the table too.
    await pool.query(
      `insert into "${schema}".partition_owners (partition, owner, epoch, lease_expires_at) values ($1, 'me', 3, 0)`,
      [partition]
    )
    const lost: Array<FencedEpoch> = []
    const fence: Fence = {
      owner: "me",
      epochOf: (candidate) => (candidate === partition ? 3 : undefined),
      superseded: (partitionsLost) => lost.push(...partitionsLost)
    }
    const opened = await acquireScoped(makePostgresStore({ pool, schema, partitions, fence, pipelined }))
    const write = (id: string, epoch: number) =>
      Effect.runPromise(
        Effect.result(
          opened.value.write([holdEvent(user, id)], { partition, epoch, position: epoch * 10, token: "test" })
        )
      )
    // Decided from memory loaded under epoch 1 (a write queued before the loss): refused before sending.
    expect(Result.isFailure(await write("queued-before-loss", 1))).toBe(true)
    expect(Result.isSuccess(await write("decided-now", 3))).toBe(true)
    await checkpointAll(pool, schema)
    const rows = await pool.query(`select id from "${schema}".holds order by id`)
    expect(rows.rows.map((row) => row.id)).toEqual(["decided-now"])
    // A stale write says nothing of the current epoch: the partition is not stepped down from.
    expect(lost).toEqual([])
    await opened.close()
    await pool.end()
  })
})

describe("fence lock modes (migration 0004)", () => {
  it("a claim skips a partition with a write in flight; a renewal does not wait; the write after the claim fails", async () => {
    const schema = database.freshSchema("locks")
    const pool = new pg.Pool({ connectionString: database.connectionString, max: 4 })
    pool.on("error", () => {})
    await Effect.runPromise(migrate(pool, schema))
    const queries = makeOwnershipQueries(pool, schema)
    const claimedByMe = await Effect.runPromise(queries.claim("me", [3], 60_000))
    expect(claimedByMe).toEqual(new Map([[3, 1]]))

    const writer = await pool.connect()
    await writer.query("begin")
    await writer.query(`select "${schema}".assert_partition_epochs($1, $2, 'me')`, [[3], [1]])

    // Renewal is NO KEY UPDATE: it does not wait for the writer's KEY SHARE.
    const renewed = await Effect.runPromise(queries.renew("me", new Map([[3, 1]]), 60_000))
    expect([...renewed]).toEqual([3])

    // The lease is over (forced here). Another process's claim skips the row while the write is in
    // flight (no write of the old epoch can land after a claim), and takes it once the write committed.
    await pool.query(`update "${schema}".partition_owners set lease_expires_at = 0 where partition = 3`)
    expect(await Effect.runPromise(queries.claim("other", [3], 60_000))).toEqual(new Map())
    await writer.query("commit")
    expect(await Effect.runPromise(queries.claim("other", [3], 60_000))).toEqual(new Map([[3, 2]]))

    await writer.query("begin")
    const refused = await writer
      .query(`select "${schema}".assert_partition_epochs($1, $2, 'me')`, [[3], [1]])
      .then(
        () => undefined,
        (error: { code?: string; detail?: string }) => error
      )
    await writer.query("rollback")
    writer.release()
    expect(refused).toMatchObject({ code: "QCF01", detail: "3" })
    await pool.end()
  })
})
