/**
 * A checkpoint without a bound (a partition's open, `checkpointAll`) runs beside the owner's appends:
 * it goes as far as the log stands, so an append still running below the log's last position must end
 * before it reads, or its row is passed over unprojected and, once the mark is past it, never projected
 * (an acknowledged change missing from the tables, then from every load). Found by the nemesis: its
 * database check every 5 s brought the tables up to date while three processes appended.
 *
 * And an owner's own checkpoint goes up to `through`, which may name positions of its appends that
 * failed (no row): once another process claimed the partition and hands those positions out again, a
 * late checkpoint of the old owner would move the mark past the new owner's row. It checks the owner
 * row's epoch, held against a claim, and writes nothing under a stale one.
 *
 * This machine's Postgres (the file's own schema): one append held open in its transaction (the fence
 * taken, its row inserted, no COMMIT yet) while a checkpoint runs.
 */
import { Effect, Result } from "effect"
import { afterAll, describe, expect, it } from "vitest"
import type { StoreEvent } from "../../src/domain/events.js"
import { checkpointRowsPerTransactionMax } from "../../src/domain/limits.js"
import { migrate } from "../../src/store/postgres/migrate.js"
import { checkpointAll, encodeBody } from "../../src/store/postgres/partitionLog.js"
import { makePostgresStore } from "../../src/store/postgres/PostgresStore.js"
import { acquireScoped, createTestSchema } from "../support/database.js"

const database = createTestSchema("checkpoint_beside")
afterAll(() => database.drop())

const now = 1_790_000_000_000
const partition = 3

const holdEvent = (id: string): StoreEvent => ({
  kind: "hold",
  user: "beside-user",
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

describe("checkpoints beside appends", () => {
  it("an unbounded one (checkpointAll) waits for an append still running below the log's last row, and projects both", async () => {
    const schema = database.freshSchema("unbounded")
    const pool = database.pool({ max: 4 })
    await Effect.runPromise(migrate(pool, schema))
    await pool.query(
      `insert into "${schema}".partition_owners (partition, owner, epoch, lease_expires_at) values ($1, 'me', 1, 0)`,
      [partition]
    )
    // What appendGroup sends: the fence (the owner row FOR KEY SHARE), then the row.
    const append = async (client: { query: typeof pool.query }, id: string, position: number) => {
      await client.query(`select "${schema}".assert_partition_epochs($1::integer[], $2::bigint[], 'me')`, [
        [partition],
        [1]
      ])
      await client.query(
        `insert into "${schema}".partition_log (partition, position, token, events, body) values ($1, $2, 't', 0, $3)`,
        [partition, position, encodeBody([holdEvent(id)])]
      )
    }
    const slow = await pool.connect()
    await slow.query("begin")
    await append(slow, "first", 1)
    // A later group's append commits while the first is still in its transaction.
    const fast = await pool.connect()
    await fast.query("begin")
    await append(fast, "second", 2)
    await fast.query("commit")
    fast.release()

    const checkpoint = checkpointAll(pool, schema)
    await new Promise((resolve) => setTimeout(resolve, 300))
    await slow.query("commit")
    slow.release()
    await checkpoint
    await checkpointAll(pool, schema)

    const holds = await pool.query<{ id: string }>(`select id from "${schema}".holds order by id`)
    expect(holds.rows.map((row) => row.id)).toEqual(["first", "second"])
    const progress = await pool.query<{ checkpointed: string }>(
      `select checkpointed::text from "${schema}".partition_progress where partition = $1`,
      [partition]
    )
    expect(progress.rows[0]?.checkpointed).toBe("2")
  })

  it("an owner's checkpoint under a stale epoch writes nothing: no mark past the new owner's row", async () => {
    const schema = database.freshSchema("stale")
    const pool = database.pool({ max: 4 })
    await Effect.runPromise(migrate(pool, schema))
    await pool.query(
      `insert into "${schema}".partition_owners (partition, owner, epoch, lease_expires_at) values ($1, 'me', 1, 0)`,
      [partition]
    )
    const fence = { owner: "me", epochOf: () => 1, superseded: () => {} }
    const store = await acquireScoped(
      makePostgresStore({ pool, schema, partitions: 8, fence, pipelined: true })
    )
    await Effect.runPromise(
      store.value.write([holdEvent("mine")], { partition, epoch: 1, position: 1, token: "a" })
    )
    // Its append at 2 failed (no row); another process claims the partition and appends there.
    await pool.query(
      `update "${schema}".partition_owners set owner = 'other', epoch = 2 where partition = $1`,
      [partition]
    )
    const other = await pool.connect()
    await other.query("begin")
    await other.query(`select "${schema}".assert_partition_epochs($1::integer[], $2::bigint[], 'other')`, [
      [partition],
      [2]
    ])
    await other.query(
      `insert into "${schema}".partition_log (partition, position, token, events, body) values ($1, 2, 'b', 0, $2)`,
      [partition, encodeBody([holdEvent("theirs")])]
    )
    // The old owner's checkpoint, late, through its failed position 2.
    const late = await Effect.runPromise(
      Effect.result(
        store.value.checkpoint(partition, [{ position: 1, events: [holdEvent("mine")] }], 2, 2, 1)
      )
    )
    await other.query("commit")
    other.release()
    await checkpointAll(pool, schema)
    const holds = await pool.query<{ id: string }>(`select id from "${schema}".holds order by id`)
    expect(holds.rows.map((row) => row.id)).toEqual(["mine", "theirs"])
    expect(Result.isFailure(late)).toBe(true)
    await store.close()
  })

  it("one that reads back in pieces goes no further than its last row read, and publishes no further", async () => {
    const schema = database.freshSchema("pieces")
    const pool = database.pool({ max: 4 })
    await Effect.runPromise(migrate(pool, schema))
    const rows = checkpointRowsPerTransactionMax + 44
    // Appends whose COMMITs got no answer and landed (not held by the owner), then one it holds.
    const landed = Array.from({ length: rows - 1 }, (_, index) => index + 1)
    await pool.query(
      `insert into "${schema}".partition_log (partition, position, token, events, body)
       select $1, position, 't', 0, body from unnest($2::bigint[], $3::text[]) as landed (position, body)`,
      [partition, landed, landed.map((position) => encodeBody([holdEvent(`landed-${position}`)]))]
    )
    await pool.query(
      `insert into "${schema}".partition_log (partition, position, token, events, body) values ($1, $2, 't', 0, $3)`,
      [partition, rows, encodeBody([holdEvent("held")])]
    )
    const store = await acquireScoped(makePostgresStore({ pool, schema, partitions: 8, pipelined: true }))
    const checkpoint = () =>
      Effect.runPromise(
        store.value.checkpoint(partition, [{ position: rows, events: [holdEvent("held")] }], rows, rows, 0)
      )
    expect(await checkpoint()).toBe(checkpointRowsPerTransactionMax)
    const marks = await pool.query<{ checkpointed: string; published: string }>(
      `select checkpointed::text, published::text from "${schema}".partition_progress where partition = $1`,
      [partition]
    )
    expect(marks.rows[0]).toEqual({
      checkpointed: String(checkpointRowsPerTransactionMax),
      published: String(checkpointRowsPerTransactionMax)
    })
    expect(await checkpoint()).toBe(rows)
    const holds = await pool.query<{ count: string }>(`select count(*)::text as count from "${schema}".holds`)
    expect(Number(holds.rows[0]!.count)).toBe(rows)
    await store.close()
  })
})
