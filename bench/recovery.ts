/**
 * What a partition's recovery after a crash costs, and the worst user's load (issue 36). Not a test.
 *
 * A partition's new owner opens its log before it serves: it projects the tail the previous owner left
 * (rows after the checkpoint) into the tables, then loads each user on its first command. The tail is
 * at most checkpointLogRowsMax rows in normal running (a checkpoint starts there, or a second after the
 * oldest row) and at most unprojectedLogRowsMax when checkpoints kept failing (appends are refused past
 * it). Per tail length: the tail's rows are appended through the store as an actor appends them (each a
 * batch of `--batch` decisions from the real domain, reserves of new holds and commits of earlier ones,
 * over `--users` users of the partition), then a fresh store (a new process's pool) opens the partition,
 * timed, then loads every user of it, timed in statements of storeUsersPerLoadMax.
 *
 * The worst user's load: one user with `loadRememberedIdsPerUserMax` + 5 000 closed holds and as many
 * adjust ids within the retention window (seeded in SQL), the most a load reads of one user; its load
 * timed `--repeat` times.
 *
 *   npx tsx bench/recovery.ts [--batch 16] [--users 500] [--repeat 5] [--out bench/results]
 */
import { randomBytes } from "node:crypto"
import { mkdir, writeFile } from "node:fs/promises"
import os from "node:os"
import { parseArgs } from "node:util"
import { Effect, Exit, Scope } from "effect"
import pg from "pg"
import type { Command } from "../src/domain/commands.js"
import { defaultConfig } from "../src/domain/config.js"
import { decide } from "../src/domain/decide.js"
import type { StoreEvent } from "../src/domain/events.js"
import {
  checkpointLogRowsMax,
  loadRememberedIdsPerUserMax,
  storeUsersPerLoadMax,
  unprojectedLogRowsMax
} from "../src/domain/limits.js"
import { partitionOf } from "../src/domain/partition.js"
import type { UserState } from "../src/domain/state.js"
import { emptyUserState } from "../src/domain/state.js"
import { migrate } from "../src/store/postgres/migrate.js"
import { makePostgresStore, poolConfig } from "../src/store/postgres/PostgresStore.js"
import { ensureSettings } from "../src/store/postgres/settings.js"
import { machineInfo } from "./lib/machine.js"

const { values: options } = parseArgs({
  options: {
    batch: { type: "string", default: "16" },
    users: { type: "string", default: "500" },
    repeat: { type: "string", default: "5" },
    out: { type: "string", default: new URL("results", import.meta.url).pathname }
  }
})
const batch = Number(options.batch)
const userCount = Number(options.users)
const repeat = Number(options.repeat)
const partitions = 64
const partition = 0
const schema = "quota"
const adminUrl = process.env["DATABASE_URL"] ?? "postgres://postgres@127.0.0.1:5432/test"

const usersOfPartition = (count: number, label: string): Array<string> => {
  const found: Array<string> = []
  for (let index = 0; found.length < count; index += 1)
    if (partitionOf(`${label}-${index}`, partitions) === partition) found.push(`${label}-${index}`)
  return found
}

/** `rows` batches of the real domain's decisions: half reserves of new holds, half commits of earlier ones. */
const generateRows = (rows: number, users: ReadonlyArray<string>, now: number): Array<Array<StoreEvent>> => {
  const states = new Map<string, UserState>()
  const context = { config: defaultConfig, now, random: () => 0.5 }
  const decideEvents = (command: Command): ReadonlyArray<StoreEvent> => {
    const state = states.get(command.user) ?? emptyUserState(command.user)
    states.set(command.user, state)
    const decision = decide(state, command, context)
    return decision.events
  }
  const pending: Array<{ user: string; id: string }> = []
  const generated: Array<Array<StoreEvent>> = []
  let next = 0
  for (let row = 0; row < rows; row += 1) {
    const events: Array<StoreEvent> = []
    for (let index = 0; index < batch; index += 1) {
      if (index % 2 === 1 && pending.length > 0) {
        const { user, id } = pending.shift()!
        events.push(...decideEvents({ op: "commit", user, id, amount: 7 }))
      } else {
        const hold = { user: users[next % users.length]!, id: `h${next}` }
        next += 1
        events.push(
          ...decideEvents({ op: "reserve", ...hold, meter: "analysis", amount: 10, ttlMs: 3_600_000 })
        )
        pending.push(hold)
      }
    }
    generated.push(events)
  }
  return generated
}

const median = (values: ReadonlyArray<number>): number => {
  const sorted = [...values].sort((left, right) => left - right)
  return sorted[Math.floor(sorted.length / 2)]!
}

/** A store on a pool of its own (as a new process has), used by `use`, then closed. */
const withStore = async <A>(
  url: string,
  use: (store: Effect.Success<ReturnType<typeof makePostgresStore>>) => Promise<A>
): Promise<A> => {
  const pool = new pg.Pool(poolConfig(url, 8, true))
  pool.on("error", () => {})
  const scope = Effect.runSync(Scope.make())
  try {
    const store = await Effect.runPromise(
      Scope.provide(scope)(makePostgresStore({ pool, schema, partitions }))
    )
    return await use(store)
  } finally {
    await Effect.runPromise(Scope.close(scope, Exit.void))
    await pool.end()
  }
}

interface TailRun {
  readonly rows: number
  readonly events: number
  readonly logBytes: number
  readonly bodyBytesPerRow: number
  readonly openMs: number
  readonly usersLoaded: number
  readonly loadMs: number
}

/**
 * A database of its own, migrated (`setup`: a small pool on it, ended by the caller), dropped WITH
 * (FORCE) after `use`, whatever happened.
 */
const withBenchDatabase = async <A>(use: (url: string, setup: pg.Pool) => Promise<A>): Promise<A> => {
  const database = `bench_recovery_${randomBytes(4).toString("hex")}`
  const admin = new pg.Client({ connectionString: adminUrl })
  await admin.connect()
  await admin.query(`create database ${database}`)
  const url = Object.assign(new URL(adminUrl), { pathname: `/${database}` }).toString()
  try {
    const setup = new pg.Pool({ connectionString: url, max: 2 })
    // Its idle clients end when the database is dropped: not an error here.
    setup.on("error", () => {})
    await Effect.runPromise(migrate(setup, schema))
    await Effect.runPromise(ensureSettings(setup, schema, { prefix: "bench", partitions }))
    return await use(url, setup)
  } finally {
    await admin.query(`drop database if exists ${database} with (force)`)
    await admin.end()
  }
}

const runTail = (rows: number): Promise<TailRun> =>
  withBenchDatabase(async (url, setup) => {
    const users = usersOfPartition(userCount, "recovery")
    const generated = generateRows(rows, users, Date.now())
    let events = 0
    // The previous owner: appends the tail, then dies before any checkpoint.
    await withStore(url, async (store) => {
      for (const [index, row] of generated.entries()) {
        events += row.length
        await Effect.runPromise(
          store.write(row, { partition, epoch: 0, position: index + 1, token: "0123456789abcdef" })
        )
      }
    })
    const size = await setup.query<{ bytes: string; body: string }>(
      `select pg_total_relation_size('${schema}.partition_log')::text as bytes,
              coalesce(avg(octet_length(body)), 0)::text as body from ${schema}.partition_log`
    )
    // The new owner: opens the partition (the tail projected), then loads every user of it.
    const { openMs, loadMs } = await withStore(url, async (store) => {
      const openedAt = performance.now()
      await Effect.runPromise(store.openPartition(partition))
      const openMs = performance.now() - openedAt
      const loadedAt = performance.now()
      for (let from = 0; from < users.length; from += storeUsersPerLoadMax)
        await Effect.runPromise(store.loadUsers(users.slice(from, from + storeUsersPerLoadMax), Date.now()))
      return { openMs, loadMs: performance.now() - loadedAt }
    })
    const left = await setup.query<{ checkpointed: string }>(
      `select checkpointed::text from ${schema}.partition_progress where partition = $1`,
      [partition]
    )
    if (Number(left.rows[0]?.checkpointed) !== rows)
      throw new Error(`the open checkpointed ${left.rows[0]?.checkpointed} of ${rows} rows`)
    await setup.end()
    return {
      rows,
      events,
      logBytes: Number(size.rows[0]!.bytes),
      bodyBytesPerRow: Number(size.rows[0]!.body),
      openMs,
      usersLoaded: users.length,
      loadMs
    }
  })

const runWorstUser = (): Promise<{ ids: number; loadMs: Array<number> }> =>
  withBenchDatabase(async (url, setup) => {
    const user = usersOfPartition(1, "worst")[0]!
    const count = loadRememberedIdsPerUserMax + 5_000
    const newest = Date.now() - 60_000
    await setup.query(
      `insert into ${schema}.holds
         (user_id, id, meter, amount, consumed, state, expires_at, created_at, closed_at, partition)
       select $1, 'h-' || n, 'analysis', 1, 1, 'committed', $2::bigint + 600000,
              $2::bigint - ($3::bigint - n) * 1000 - 10, $2::bigint - ($3::bigint - n) * 1000, $4
       from generate_series(0, $3::bigint - 1) as n`,
      [user, newest, count, partition]
    )
    await setup.query(
      `insert into ${schema}.usage_ledger (user_id, meter, period_start, operation, hold_id, key, requested, delta, at)
       select $1, 'storage_bytes', -1, 'adjust', null, 'a-' || n, 1, 1, $2::bigint - ($3::bigint - n) * 1000
       from generate_series(0, $3::bigint - 1) as n`,
      [user, newest, count]
    )
    await setup.query("analyze")
    await setup.end()
    const loadMs: Array<number> = []
    await withStore(url, async (store) => {
      for (let run = 0; run < repeat; run += 1) {
        const startedAt = performance.now()
        await Effect.runPromise(store.loadUsers([user], Date.now()))
        loadMs.push(performance.now() - startedAt)
      }
    })
    return { ids: 2 * count, loadMs }
  })

const tails: Array<TailRun> = []
for (const rows of [checkpointLogRowsMax, unprojectedLogRowsMax]) {
  process.stderr.write(`tail of ${rows} rows\n`)
  tails.push(await runTail(rows))
}
process.stderr.write("worst user\n")
const worst = await runWorstUser()

const machine = machineInfo()
const lines = [
  `# Recovery of a partition and the worst user's load, ${new Date().toISOString().slice(0, 16).replace("T", " ")} UTC`,
  "",
  `Machine: ${machine.cpuModel}, ${machine.cores} cores, ${machine.memoryGiB} GiB, Node ${machine.node}, ${machine.platform}. Code: ${machine.code}. Load average at the end: ${os
    .loadavg()
    .map((load) => load.toFixed(2))
    .join(", ")}. \`npx tsx bench/recovery.ts --batch ${batch} --users ${userCount} --repeat ${repeat}\`.`,
  "",
  `A tail of rows left by an owner that died before checkpointing, each a batch of ${batch} decisions (reserves`,
  `of new holds and commits of earlier ones over ${userCount} users of the partition); a new store opens the`,
  "partition (the tail projected into the tables), then loads every user of it.",
  "",
  "| tail rows | events | log size | body per row | open (projection) | load of every user | users |",
  "| --------- | ------ | -------- | ------------ | ----------------- | ------------------ | ----- |",
  ...tails.map(
    (run) =>
      `| ${run.rows} | ${run.events} | ${(run.logBytes / 1024).toFixed(0)} KiB | ${run.bodyBytesPerRow.toFixed(0)} B | ` +
      `${run.openMs.toFixed(0)} ms | ${run.loadMs.toFixed(0)} ms | ${run.usersLoaded} |`
  ),
  "",
  `The worst user's load: ${worst.ids} remembered ids (closed holds and adjust ids, ${loadRememberedIdsPerUserMax}`,
  `of each read): ${worst.loadMs.map((ms) => ms.toFixed(0)).join(", ")} ms (median ${median(worst.loadMs).toFixed(0)} ms).`,
  ""
]
const report = lines.join("\n")
process.stdout.write(report)
await mkdir(options.out, { recursive: true })
const file = `${options.out}/${new Date().toISOString().slice(0, 10)}-recovery.md`
await writeFile(file, report)
process.stderr.write(`written to ${file}\n`)
