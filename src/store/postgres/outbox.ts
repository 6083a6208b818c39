/**
 * The events outbox in Postgres (migrations 0006, 0011): one query per function. Its rows are read
 * through `readSettled` (the store's outcome doubts): a row that a settle made visible on the primary
 * before the synchronous standby had it is not read, so never published, until the standby has it.
 */
import { Effect } from "effect"
import type pg from "pg"
import type { QuotaEventKind } from "../../domain/events.js"
import type { OutboxRow, OutboxShape } from "../../events/Outbox.js"
import { storeUnavailable } from "./errors.js"
import { incarnationText } from "./incarnation.js"
import type { SettledRead } from "./outcomeDoubts.js"
import { fromStoredText } from "./storedText.js"

const outboxStatements = (schema: string) => ({
  // Ordered by the column, not by the text of the output (which ORDER BY would otherwise take: "10" < "9").
  read: `
    select outbox.seq::text as seq_text, outbox.incarnation::text as incarnation, outbox.user_id,
           outbox.kind, outbox.body
    from "${schema}".events_outbox as outbox
    where outbox.partition = $1 order by outbox.seq limit $2`,
  remove: `delete from "${schema}".events_outbox where seq = any($1::bigint[])`,
  count: `
    select partition, count(*)::integer as rows from "${schema}".events_outbox
    where partition = any($1::integer[]) group by partition`
})

export const makePostgresOutbox = (
  pool: pg.Pool,
  schema: string,
  createdAt: number,
  /** The store's (PostgresStore.readSettled): without it, rows the standby lacks could be published. */
  readSettled: SettledRead
): OutboxShape => {
  const statements = outboxStatements(schema)
  return {
    databaseTag: createdAt.toString(36),
    read: (partition, limit) =>
      Effect.tryPromise({
        try: async () => {
          const result = await readSettled(() =>
            pool.query<{
              seq_text: string
              incarnation: string | null
              user_id: string
              kind: string
              body: string
            }>(statements.read, [partition, limit])
          )
          return result.rows.map((row): OutboxRow => ({
            seq: Number(row.seq_text),
            incarnation: incarnationText(row.incarnation),
            user: fromStoredText(row.user_id),
            kind: row.kind as QuotaEventKind,
            body: row.body
          }))
        },
        catch: storeUnavailable(`read the events outbox of partition ${partition}`)
      }),
    remove: (seqs) =>
      Effect.tryPromise({
        try: async () => {
          if (seqs.length > 0) await pool.query(statements.remove, [seqs])
        },
        catch: storeUnavailable(`remove ${seqs.length} published events`)
      }),
    count: (partitions) =>
      Effect.tryPromise({
        try: async () => {
          const result = await pool.query<{ partition: number; rows: number }>(statements.count, [partitions])
          return new Map(result.rows.map((row) => [row.partition, row.rows]))
        },
        catch: storeUnavailable("count the events outbox")
      })
  }
}
