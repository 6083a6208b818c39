/**
 * Today's durable write path against a log-structured prototype, measured in one run. Not a test.
 *
 * The workload is uniform over 10 000 users; a cycle is a reserve of 10 then a commit of 10 on a new
 * hold. The StoreEvents come from the real domain (`decide`), all generated before any timing. A
 * group holds G new reserves and the commits of the cycles its writer reserved in its previous group:
 * as in the coordinator, a commit is written only after its reserve committed. Writer w draws from the
 * users numbered w mod W, so no user is in two groups in flight (one actor per user guarantees that;
 * without it, concurrent upserts of one usage_totals row deadlock). Variants, each in its own schema
 * of one fresh database, dropped at the end:
 *
 *   tables:     writeGroup from src/store/postgres/writeEvents.ts, pipelined and fenced (the partition
 *               owner check of a scaled-out deployment), W writers each with its own chain of groups.
 *   log append: per group, one pipelined transaction: the same fence check on a small epochs table,
 *               then one row per partition touched holding that partition's events as JSON in a bytea.
 *   log apply:  a log run's rows read back in batches of about 1 000 cycles, collapsed with
 *               collapseEvents and groupQueries into the tables of a migrated schema, then deleted
 *               from the log; one connection, for at most the same seconds.
 *
 * Per run: cycles/s, CPU per 1 000 cycles of the Postgres backends serving the run (from /proc) and
 * of this process, and WAL bytes per cycle (cluster-wide: other databases' writes count too). Order:
 * tables, log, tables, log, apply, apply. Prints Markdown and writes bench/results/<date>-write-path.md.
 *
 *   npx tsx bench/writePath.ts [--seconds 5] [--cycles-per-group 64] [--writers 4]
 */
import { randomBytes } from "node:crypto"
import { mkdir, writeFile } from "node:fs/promises"
import { parseArgs } from "node:util"
import { Effect } from "effect"
import pg from "pg"
import type { Command } from "../src/domain/commands.js"
import { defaultConfig } from "../src/domain/config.js"
import { decide } from "../src/domain/decide.js"
import type { StoreEvent } from "../src/domain/events.js"
import { partitionOf } from "../src/domain/partition.js"
import type { UserState } from "../src/domain/state.js"
import { emptyUserState } from "../src/domain/state.js"
import type { Fence } from "../src/store/Fence.js"
import { poolConfig } from "../src/store/postgres/PostgresStore.js"
import { migrate } from "../src/store/postgres/migrate.js"
import type { GroupQuery } from "../src/store/postgres/writeEvents.js"
import {
  collapseEvents,
  groupQueries,
  writeGroup,
  writeStatements
} from "../src/store/postgres/writeEvents.js"
import { processCpuMs } from "./lib/cpu.js"
import { logAppendQueries, sendPipelined } from "./lib/logAppend.js"
import { machineInfo } from "./lib/machine.js"
import { makeRng } from "./lib/rng.js"

const { values: options } = parseArgs({
  options: {
    seconds: { type: "string", default: "5" },
    "cycles-per-group": { type: "string", default: "64" },
    writers: { type: "string", default: "4" }
  }
})
const seconds = Number(options.seconds)
const cyclesPerGroup = Number(options["cycles-per-group"])
const writers = Number(options.writers)
const users = 10_000
const partitions = 64
const epoch = 1
const owner = "bench-write-path"
const cyclesPerApplyBatch = 1_000
/** Groups are generated for this rate over a whole run; a faster run would stop early, out of groups. */
const cyclesPerSecondCeiling = 100_000
const adminUrl = process.env["DATABASE_URL"] ?? "postgres://postgres@127.0.0.1:5432/test"
const database = `bench_writepath_${randomBytes(4).toString("hex")}`
const databaseUrl = Object.assign(new URL(adminUrl), { pathname: `/${database}` }).toString()
const resultFile = new URL(`results/${new Date().toISOString().slice(0, 10)}-write-path.md`, import.meta.url)

/** Commands written; a cycle is a reserve and a commit. */
interface Written {
  readonly reserves: number
  readonly commits: number
}
const cyclesOf = (written: Written) => (written.reserves + written.commits) / 2

interface Group extends Written {
  readonly events: ReadonlyArray<StoreEvent>
}

/** Group k: the commits of group k - W (the same writer's previous group), then G new reserves. */
const generateGroups = (groupCount: number): Array<Group> => {
  const states = new Map<string, UserState>()
  const random = makeRng(1)
  const context = { config: defaultConfig, now: Date.UTC(2026, 10, 25), random: () => 0.5 }
  const decideEvents = (command: Command, expected: string): ReadonlyArray<StoreEvent> => {
    const state = states.get(command.user) ?? emptyUserState(command.user)
    states.set(command.user, state)
    const decision = decide(state, command, context)
    if (decision.result?.status !== expected) throw new Error(`${command.op}: ${decision.result?.status}`)
    return decision.events
  }
  const reservedBy = new Map<number, Array<{ user: string; id: string }>>()
  const groups: Array<Group> = []
  for (let index = 0; index < groupCount; index += 1) {
    const events: Array<StoreEvent> = []
    const commits = reservedBy.get(index - writers) ?? []
    reservedBy.delete(index - writers)
    for (const { user, id } of commits) {
      events.push(...decideEvents({ op: "commit", user, id, amount: 10 }, "committed"))
    }
    const reserves: Array<{ user: string; id: string }> = []
    for (let cycle = index * cyclesPerGroup; cycle < (index + 1) * cyclesPerGroup; cycle += 1) {
      const hold = {
        user: `user-${random.int(users / writers) * writers + (index % writers)}`,
        id: `h${cycle}`
      }
      const reserve = { op: "reserve", ...hold, meter: "analysis", amount: 10, ttlMs: 60_000 } as const
      events.push(...decideEvents(reserve, "reserved"))
      reserves.push(hold)
    }
    reservedBy.set(index, reserves)
    groups.push({ events, reserves: reserves.length, commits: commits.length })
  }
  return groups
}

/** A pool of `size` connections that stay open, and the pids of the backends serving them. */
const openPool = async (size: number) => {
  const pool = new pg.Pool({ ...poolConfig(databaseUrl, size, true), idleTimeoutMillis: 0 })
  pool.on("error", () => {})
  const clients = await Promise.all(Array.from({ length: size }, () => pool.connect()))
  const pidOf = async (client: pg.PoolClient) =>
    (await client.query<{ pid: number }>("select pg_backend_pid() as pid")).rows[0]!.pid
  const backendPids = await Promise.all(clients.map(pidOf))
  for (const client of clients) client.release()
  return { pool, backendPids }
}

/** utime + stime of the processes, in milliseconds. */
const cpuMsOf = (pids: ReadonlyArray<number>): number =>
  pids.reduce((total, pid) => total + processCpuMs(pid), 0)

interface Run {
  readonly variant: "tables" | "log append" | "log apply"
  readonly seconds: number
  readonly written: Written
  readonly cycles: number
  readonly postgresCpuMs: number
  readonly benchCpuMs: number
  readonly walBytes: number
}

const admin = new pg.Client({ connectionString: adminUrl })
/** Reads WAL positions and counts rows; its backend's CPU is not counted. */
const monitor = new pg.Client({ connectionString: databaseUrl })
const queryOne = async (text: string, values: Array<unknown> = []): Promise<string> =>
  Object.values((await monitor.query<Record<string, string>>(text, values)).rows[0]!)[0]!

const measure = async (
  variant: Run["variant"],
  pids: ReadonlyArray<number>,
  body: () => Promise<Written>
) => {
  const walBefore = await queryOne("select pg_current_wal_lsn()::text")
  const postgresBefore = cpuMsOf(pids)
  const benchBefore = process.cpuUsage()
  const startedAt = performance.now()
  const written = await body()
  const elapsedSeconds = (performance.now() - startedAt) / 1_000
  const bench = process.cpuUsage(benchBefore)
  const postgresCpuMs = cpuMsOf(pids) - postgresBefore
  const walBytes = Number(
    await queryOne("select pg_wal_lsn_diff(pg_current_wal_lsn(), $1)::text", [walBefore])
  )
  const benchCpuMs = (bench.user + bench.system) / 1_000
  const run = {
    variant,
    seconds: elapsedSeconds,
    written,
    cycles: cyclesOf(written),
    postgresCpuMs,
    benchCpuMs,
    walBytes
  }
  console.error(`${variant}: ${run.cycles} cycles in ${elapsedSeconds.toFixed(1)} s`)
  return run
}

/** W writers, writer w taking groups w, w + W, w + 2W ... until the time is up. */
const runWriters = async (groups: ReadonlyArray<Group>, write: (group: Group) => Promise<void>) => {
  const deadline = performance.now() + seconds * 1_000
  let reserves = 0
  let commits = 0
  const writer = async (first: number) => {
    for (let index = first; index < groups.length && performance.now() < deadline; index += writers) {
      await write(groups[index]!)
      reserves += groups[index]!.reserves
      commits += groups[index]!.commits
    }
  }
  await Promise.all(Array.from({ length: writers }, (_, first) => writer(first)))
  return { reserves, commits }
}

/** Every command landed: one hold per reserve written, one ledger row per commit. */
const expectRows = async (schema: string, written: Written) => {
  const holds = Number(await queryOne(`select count(*) from "${schema}".holds`))
  const ledger = Number(await queryOne(`select count(*) from "${schema}".usage_ledger`))
  if (holds !== written.reserves || ledger !== written.commits) {
    throw new Error(`${schema} has ${holds} holds and ${ledger} ledger rows for ${JSON.stringify(written)}`)
  }
}

const runTables = async (schema: string, groups: ReadonlyArray<Group>): Promise<Run> => {
  const { pool, backendPids } = await openPool(writers)
  await Effect.runPromise(migrate(pool, schema))
  await pool.query(
    `insert into "${schema}".partition_owners select partition, $1, $2, $3 from generate_series(0, $4 - 1) as partition`,
    [owner, epoch, Number.MAX_SAFE_INTEGER, partitions]
  )
  const statements = writeStatements(schema)
  const fence: Fence = { owner, epochOf: () => epoch, superseded: () => {} }
  const run = await measure("tables", backendPids, () =>
    runWriters(groups, (group) =>
      writeGroup(pool, statements, [{ events: group.events, target: undefined }], partitions, fence, true)
    )
  )
  await expectRows(schema, run.written)
  await pool.end()
  return run
}

/** The log, the epochs it is fenced with, and a fence check that locks as migration 0004's does. */
const logSchemaSql = (schema: string) => `
  create schema "${schema}";
  create table "${schema}".partition_epochs (partition integer primary key, owner text not null, epoch bigint not null);
  insert into "${schema}".partition_epochs select partition, '${owner}', ${epoch} from generate_series(0, ${partitions - 1}) as partition;
  create table "${schema}".events_log (partition integer not null, epoch bigint not null, seq bigserial primary key, events bytea not null);
  create function "${schema}".assert_epochs(held_partitions integer[], held_epochs bigint[], held_owner text)
  returns void language plpgsql as $$
  begin
    perform 1 from "${schema}".partition_epochs as held where held.partition = any(held_partitions)
      order by held.partition for key share;
    if exists (select 1 from unnest(held_partitions, held_epochs) as wanted (partition, epoch)
      where not exists (select 1 from "${schema}".partition_epochs as held where held.partition = wanted.partition
        and held.epoch = wanted.epoch and held.owner = held_owner)) then
      raise exception 'partition epoch superseded';
    end if;
  end;
  $$;`

/** The log variant's append: its fence function on the epochs table, one row of JSON events per partition. */
const appendQueries = (schema: string, events: ReadonlyArray<StoreEvent>): Array<GroupQuery> => {
  const byPartition = new Map<number, Array<StoreEvent>>()
  for (const event of events) {
    const partition = partitionOf(event.user, partitions)
    const list = byPartition.get(partition)
    if (list === undefined) byPartition.set(partition, [event])
    else list.push(event)
  }
  const rows = new Map<number, Uint8Array>()
  for (const [partition, list] of byPartition) rows.set(partition, Buffer.from(JSON.stringify(list)))
  return logAppendQueries(
    {
      fence: {
        name: "log_fence",
        text: `select "${schema}".assert_epochs($1::integer[], $2::bigint[], $3)`
      },
      table: `"${schema}".events_log`,
      bytesColumn: "events",
      owner,
      epoch
    },
    rows
  )
}

const runLog = async (schema: string, groups: ReadonlyArray<Group>): Promise<Run> => {
  const { pool, backendPids } = await openPool(writers)
  await pool.query(logSchemaSql(schema))
  const append = async (group: Group) => {
    const client = await pool.connect()
    await sendPipelined(client, appendQueries(schema, group.events)).finally(() => client.release())
  }
  const run = await measure("log append", backendPids, () => runWriters(groups, append))
  await pool.end()
  return run
}

/** Projects a log run's rows into the tables of a new schema, oldest first, deleting what it applied. */
const runApply = async (logSchema: string, schema: string, logged: Written): Promise<Run> => {
  const { pool, backendPids } = await openPool(1)
  await Effect.runPromise(migrate(pool, schema))
  const statements = writeStatements(schema)
  const logRows = Number(await queryOne(`select count(*) from "${logSchema}".events_log`))
  const rowsPerBatch = Math.ceil((logRows / cyclesOf(logged)) * cyclesPerApplyBatch)
  const client = await pool.connect()
  const run = await measure("log apply", backendPids, async () => {
    const deadline = performance.now() + seconds * 1_000
    let reserves = 0
    let commits = 0
    while (performance.now() < deadline) {
      const read = await client.query<{ seq: string; events: Buffer }>({
        name: "log_read",
        text: `select seq, events from "${logSchema}".events_log order by seq limit $1`,
        values: [rowsPerBatch]
      })
      if (read.rows.length === 0) break
      const events = read.rows.flatMap((row) => JSON.parse(row.events.toString()) as Array<StoreEvent>)
      const projected = groupQueries(statements, collapseEvents(events, partitions))
      await sendPipelined(client, [
        { text: "begin", values: [] },
        ...projected,
        {
          name: "log_delete",
          text: `delete from "${logSchema}".events_log where seq <= $1`,
          values: [read.rows[read.rows.length - 1]!.seq]
        },
        { text: "commit", values: [] }
      ])
      reserves += events.filter((event) => event.kind === "hold" && event.hold.state === "pending").length
      commits += events.filter((event) => event.kind === "ledger").length
    }
    return { reserves, commits }
  })
  client.release()
  await expectRows(schema, run.written)
  await pool.end()
  return run
}

const report = (runs: ReadonlyArray<Run>): string => {
  const machine = machineInfo()
  const perCycle = (variant: Run["variant"], value: (run: Run) => number) => {
    const of = runs.filter((run) => run.variant === variant)
    return of.reduce((total, run) => total + value(run) / run.cycles, 0) / of.length
  }
  const postgres = (variant: Run["variant"]) => perCycle(variant, (run) => run.postgresCpuMs) * 1_000
  const wal = (variant: Run["variant"]) => perCycle(variant, (run) => run.walBytes).toFixed(0)
  const rate = (variant: Run["variant"]) => Math.round(1 / perCycle(variant, (run) => run.seconds))
  const [tables, append, apply] = [postgres("tables"), postgres("log append"), postgres("log apply")]
  const perThousand = (run: Run, value: number) => ((value / run.cycles) * 1_000).toFixed(1)
  const rows = runs.map(
    (run, index) =>
      `| ${index + 1} | ${run.variant} | ${run.seconds.toFixed(1)} | ${Math.round(run.cycles)} | ${Math.round(run.cycles / run.seconds)} | ${perThousand(run, run.postgresCpuMs)} | ${perThousand(run, run.benchCpuMs)} | ${(run.walBytes / run.cycles).toFixed(0)} |`
  )
  return [
    "# Write path: tables against log append + apply",
    "",
    `Machine: ${machine.cpuModel}, ${machine.cores} cores, Node ${machine.node}; code: ${machine.code}.`,
    `Parameters: \`--seconds ${seconds} --cycles-per-group ${cyclesPerGroup} --writers ${writers}\`; ${users} users (uniform), ${partitions} partitions, fenced, pipelined; apply in batches of about ${cyclesPerApplyBatch} cycles on one connection. Events generated before timing; log rows hold JSON.`,
    "",
    "| run | variant | s | cycles | cycles/s | Postgres CPU ms / 1000 cycles | bench CPU ms / 1000 cycles | WAL bytes / cycle |",
    "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ...rows,
    "",
    `Writing the tables directly cost the Postgres backends ${tables.toFixed(1)} ms of CPU per 1000 cycles (means over runs here and below; ${rate("tables")} cycles/s).`,
    `Appending to the log cost ${append.toFixed(1)} ms (${rate("log append")} cycles/s) and applying the log to the same tables ${apply.toFixed(1)} ms (${rate("log apply")} cycles/s on one connection).`,
    `Append alone is ${(append / tables).toFixed(2)} of the tables' Postgres CPU; append plus apply is ${(append + apply).toFixed(1)} ms, ${((append + apply) / tables).toFixed(2)} of it.`,
    `WAL per cycle: ${wal("tables")} bytes for the tables, ${wal("log append")} for the append and ${wal("log apply")} for the apply (cluster-wide, so other databases' writes count too).`,
    "CPU is that of the backends serving the bench's connections (utime + stime from /proc), not of Postgres's background processes.",
    ""
  ].join("\n")
}

const main = async () => {
  const groups = generateGroups(Math.ceil((seconds * cyclesPerSecondCeiling) / cyclesPerGroup))
  await admin.connect()
  await admin.query(`create database "${database}"`)
  try {
    await monitor.connect()
    const runs: Array<Run> = []
    for (const round of [1, 2]) {
      runs.push(await runTables(`tables_${round}`, groups), await runLog(`log_${round}`, groups))
    }
    for (const round of [1, 2]) {
      runs.push(await runApply(`log_${round}`, `applied_${round}`, runs[round * 2 - 1]!.written))
    }
    const text = report(runs)
    console.log(text)
    await mkdir(new URL(".", resultFile), { recursive: true })
    await writeFile(resultFile, text)
  } finally {
    await monitor.end().catch(() => {})
    await admin.query(`drop database if exists "${database}" with (force)`)
    await admin.end()
  }
}

await main()
