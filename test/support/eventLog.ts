/** The partition log as the events publisher's tests write and read it (src/store/postgres/partitionLog.ts). */
import { Effect } from "effect"
import type pg from "pg"
import type { StoreEvent } from "../../src/domain/events.js"
import type { EventLogShape } from "../../src/events/EventLog.js"
import { makeEventLog } from "../../src/store/postgres/partitionLog.js"
import type { PostgresStore } from "../../src/store/postgres/PostgresStore.js"

/** What the tests' database tag is (a settings creation time). */
export const testDatabaseCreatedAt = 1_790_000_000_000

export const limitChanged = (user: string, limit: number): StoreEvent => ({
  kind: "event",
  user,
  event: { event: "limit_changed", at: 1_790_000_000_000, meter: "tokens", limit }
})

/** Appends rows to `partition`'s log as an actor with claim token `token` does, each row its events. */
export const appendRows = async (
  store: PostgresStore,
  partition: number,
  token: string,
  firstPosition: number,
  rows: ReadonlyArray<ReadonlyArray<StoreEvent>>
): Promise<void> => {
  for (const [index, events] of rows.entries())
    await Effect.runPromise(
      store.write(events, { partition, epoch: 0, position: firstPosition + index, token })
    )
}

export const eventLogOf = (pool: pg.Pool, schema: string, store: PostgresStore): EventLogShape =>
  makeEventLog(pool, schema, testDatabaseCreatedAt, store.readSettled)

/** Rows of the partition's log still in the table. */
export const logRows = async (pool: pg.Pool, schema: string, partition: number): Promise<number> =>
  Number(
    (
      await pool.query<{ rows: string }>(
        `select count(*)::text as rows from "${schema}".partition_log where partition = $1`,
        [partition]
      )
    ).rows[0]!.rows
  )
