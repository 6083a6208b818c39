/**
 * The Postgres ceiling: what a bare `insert ... select * from unnest(...)` of hold-shaped rows costs
 * here, one writer, one commit per statement (autocommit, fsync'd), at the batch sizes a group commit
 * can reach at each concurrency (a commit can carry at most as many decisions as are in flight).
 * No decision, no reads, no other table: the most a write-through store of one row per decision can do.
 */
import { performance } from "node:perf_hooks"
import { startCpuMeter } from "./lib/cpu.js"
import { makeLatencyRecorder } from "./lib/latency.js"
import { holdInsertText, holdKeys, holdTableDdl } from "./lib/holdRows.js"
import type { InsertCeiling } from "./lib/results.js"
import { makePool } from "./targets/pgCommon.js"

const schema = "bench_ceiling"

export const measureInsertCeiling = async (
  connectionString: string,
  batchSizes: ReadonlyArray<number>,
  measureMs: number,
  onTick: (label: string, fraction: number) => void
): Promise<ReadonlyArray<InsertCeiling>> => {
  const pool = makePool(connectionString, 1)
  try {
    await pool.query(`drop schema if exists ${schema} cascade`)
    await pool.query(holdTableDdl(schema))
    const insertText = holdInsertText(schema)
    const results: Array<InsertCeiling> = []
    let sequence = 0
    for (const batchRows of batchSizes) {
      const latency = makeLatencyRecorder()
      const cpuMeter = startCpuMeter(undefined)
      let commits = 0
      const started = performance.now()
      while (performance.now() - started < measureMs) {
        const keys = holdKeys(batchRows, sequence)
        sequence = keys.sequence
        const before = performance.now()
        await pool.query(insertText, [keys.users, keys.ids, Date.now()])
        latency.recordMs(performance.now() - before)
        commits += 1
        onTick(`postgres unnest insert, ${batchRows} rows/commit`, (performance.now() - started) / measureMs)
      }
      const elapsedS = (performance.now() - started) / 1000
      results.push({
        batchRows,
        commits,
        rowsPerSecond: (commits * batchRows) / elapsedS,
        commitsPerSecond: commits / elapsedS,
        latency: latency.summary(),
        cpu: cpuMeter.stop()
      })
    }
    return results
  } finally {
    await pool.end()
  }
}
