/**
 * The log append of issue 27, as bench/writePath.ts measured it and bench/floorServer.ts runs it: per
 * group, one pipelined transaction: BEGIN, the epoch fence check of the partitions touched, one INSERT
 * of one row per partition touched holding that partition's bytes (bytea), COMMIT.
 */
import type pg from "pg"
import { fnv1a32OfString } from "../../src/domain/partition.js"
import type { GroupQuery, NamedStatement } from "../../src/store/postgres/writeEvents.js"
import { submitCorked } from "../../src/store/postgres/writeEvents.js"

export interface LogAppend {
  /** The fence check: takes ($1 partitions integer[], $2 epochs bigint[], $3 owner text) and fails the transaction when one is not held. */
  readonly fence: NamedStatement
  /** The log table, schema-qualified and quoted; its columns `partition`, `epoch` and `bytesColumn`. */
  readonly table: string
  readonly bytesColumn: string
  readonly owner: string
  readonly epoch: number
}

/** begin, fence, one row per partition (`values ($1, $2, $3), ...`, named per row count), commit. */
export const logAppendQueries = (
  append: LogAppend,
  rowsByPartition: ReadonlyMap<number, Uint8Array>
): Array<GroupQuery> => {
  const touched = [...rowsByPartition.keys()].sort((left, right) => left - right)
  const rows = touched.map((_, index) => `($${index * 3 + 1}, $${index * 3 + 2}, $${index * 3 + 3})`)
  return [
    { text: "begin", values: [] },
    { ...append.fence, values: [touched, touched.map(() => append.epoch), append.owner] },
    {
      // Named per table and row count: each connection plans each shape once.
      name: `log_append_${fnv1a32OfString(append.table).toString(36)}_${touched.length}`,
      text: `insert into ${append.table} (partition, epoch, ${append.bytesColumn}) values ${rows.join(", ")}`,
      values: touched.flatMap((partition) => [partition, append.epoch, rowsByPartition.get(partition)])
    },
    { text: "commit", values: [] }
  ]
}

/** Sends a transaction's statements in one write, as writeGroup does; throws unless it committed. */
export const sendPipelined = async (
  client: pg.PoolClient,
  queries: ReadonlyArray<GroupQuery>
): Promise<void> => {
  const settled = await Promise.allSettled(submitCorked(client, queries))
  const failure = settled.find((outcome) => outcome.status === "rejected")
  if (failure !== undefined) throw failure.reason
  const commit = settled[settled.length - 1]
  if (commit?.status !== "fulfilled" || commit.value.command !== "COMMIT") throw new Error("not committed")
}
