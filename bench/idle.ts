/**
 * What an idle coordinator costs: `serve` as deployed (its defaults, metrics on), started on a fresh
 * database of its own, left without traffic, and measured over a window: its CPU (utime + stime from
 * /proc, in percent of one core) and its database's transactions a second (pg_stat_database of that
 * database alone: commits and rollbacks, every autocommit statement counting one). Once per partition
 * count, so the table shows whether either grows with P.
 *
 *   npx tsx bench/idle.ts [--partitions 16,64,256] [--settle-seconds 10] [--seconds 30] [--set KEY=VALUE]...
 *                         [--out FILE]
 *
 * `--set` lays a setting over the deployed defaults (e.g. `--set QUOTA_HTTP_ADDR=off`: metrics off).
 */
import { readFileSync } from "node:fs"
import { writeFile } from "node:fs/promises"
import { setTimeout as sleep } from "node:timers/promises"
import { parseArgs } from "node:util"
import { makePool, serverUrl } from "./targets/pgCommon.js"
import { startCoordinator } from "./targets/coordinatorProcess.js"

const { values: options } = parseArgs({
  options: {
    partitions: { type: "string", default: "16,64,256" },
    "settle-seconds": { type: "string", default: "10" },
    seconds: { type: "string", default: "30" },
    set: { type: "string", multiple: true, default: [] },
    out: { type: "string" }
  }
})
const partitionCounts = options.partitions.split(",").map(Number)
const settleMs = Number(options["settle-seconds"]) * 1_000
const windowMs = Number(options.seconds) * 1_000
const settings = Object.fromEntries(
  options.set.map((assignment) => {
    const equals = assignment.indexOf("=")
    if (equals < 1) throw new Error(`--set wants KEY=VALUE, got ${JSON.stringify(assignment)}`)
    return [assignment.slice(0, equals), assignment.slice(equals + 1)]
  })
)

/** Linux's USER_HZ. */
const clockTicksPerSecond = 100

const processTicks = (pid: number): number => {
  const text = readFileSync(`/proc/${pid}/stat`, "utf8")
  const rest = text.slice(text.lastIndexOf(")") + 2).split(" ")
  return Number(rest[11]) + Number(rest[12])
}

const transactions = async (database: string): Promise<number> => {
  const admin = makePool(serverUrl, 1)
  try {
    // A fresh snapshot of the statistics, not the one cached for this session's transaction.
    await admin.query("select pg_stat_clear_snapshot()")
    const result = await admin.query<{ total: string }>(
      "select (xact_commit + xact_rollback)::text as total from pg_stat_database where datname = $1",
      [database]
    )
    return Number(result.rows[0]?.total ?? 0)
  } finally {
    await admin.end()
  }
}

interface IdleRow {
  readonly partitions: number
  readonly cpuPercent: number
  readonly transactionsPerSecond: number
}

const measure = async (partitions: number): Promise<IdleRow> => {
  const coordinator = await startCoordinator(process.cwd(), settings, partitions)
  try {
    await sleep(settleMs)
    const ticksBefore = processTicks(coordinator.pid)
    const transactionsBefore = await transactions(coordinator.database)
    const startedAt = performance.now()
    await sleep(windowMs)
    const elapsedSeconds = (performance.now() - startedAt) / 1_000
    const ticks = processTicks(coordinator.pid) - ticksBefore
    // Postgres flushes a backend's counters at most every second: a second's slack either way.
    const transactionsDone = (await transactions(coordinator.database)) - transactionsBefore
    return {
      partitions,
      cpuPercent: (100 * ticks) / clockTicksPerSecond / elapsedSeconds,
      transactionsPerSecond: transactionsDone / elapsedSeconds
    }
  } finally {
    await coordinator.stop()
  }
}

const rows: Array<IdleRow> = []
for (const partitions of partitionCounts) {
  const row = await measure(partitions)
  rows.push(row)
  console.log(
    `P = ${partitions}: coordinator CPU ${row.cpuPercent.toFixed(2)} % of a core, ` +
      `its database ${row.transactionsPerSecond.toFixed(1)} transactions/s`
  )
}
const table = [
  `Idle coordinator, ${new Date().toISOString().slice(0, 10)}: serve as deployed, no traffic, ` +
    `${settleMs / 1_000} s settling then ${windowMs / 1_000} s measured` +
    (options.set.length === 0 ? "." : `; with ${options.set.join(", ")}.`),
  "",
  "| P | coordinator CPU (% of one core) | database transactions/s |",
  "| --- | --- | --- |",
  ...rows.map(
    (row) => `| ${row.partitions} | ${row.cpuPercent.toFixed(2)} | ${row.transactionsPerSecond.toFixed(1)} |`
  ),
  ""
].join("\n")
console.log(`\n${table}`)
if (options.out !== undefined) await writeFile(options.out, table)
