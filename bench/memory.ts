/**
 * Memory of the coordinator's actors, in process (no NATS, no Postgres):
 *
 * 1. Resident memory per idle actor: N users each send one `get_usage` through
 *    `coordinatorLayer({ config: defaultConfig, residentActorsMax, sweepIntervalMs: 0 })` with
 *    `memoryStoreLayer()` (get_usage writes nothing, so the memory store holds no rows: the growth is
 *    the actors'); then N other users each reserve and commit one hold (an actor that remembers one
 *    closed hold and a usage row), with the discarding store below so no store rows count.
 * 2. One million distinct users seen, each a reserve and a commit, with the default cap of resident
 *    actors (most are evicted). The memory store keeps rows for every user it has seen, which would
 *    measure the store rather than the coordinator, so this run uses a store written here that loads
 *    every user empty and discards writes.
 *
 * Heap and RSS are read after `global.gc()` (the script re-runs itself with --expose-gc when needed).
 * Usage: npx tsx bench/memory.ts [--users 1000000] [--idle-users 100000] [--out DIR]. Writes
 * <DIR, default bench/results>/<date>-memory.md.
 */
import { spawnSync } from "node:child_process"
import { mkdir, writeFile } from "node:fs/promises"
import os from "node:os"
import { dirname, join } from "node:path"
import { fileURLToPath } from "node:url"
import { parseArgs } from "node:util"
import { Effect, Layer } from "effect"
import { Coordinator, coordinatorLayer } from "../src/actors/Coordinator.js"
import type { Command } from "../src/domain/commands.js"
import { defaultConfig } from "../src/domain/config.js"
import { emptyStoredUser } from "../src/domain/events.js"
import { residentActorsMax } from "../src/domain/limits.js"
import { memoryStoreLayer } from "../src/store/MemoryStore.js"
import type { StoreShape } from "../src/store/Store.js"
import { Store } from "../src/store/Store.js"
import { machineInfo } from "./lib/machine.js"

const thisFile = fileURLToPath(import.meta.url)
const root = join(dirname(thisFile), "..")

const gc = (globalThis as { gc?: () => void }).gc
if (gc === undefined) {
  const rerun = spawnSync(
    process.execPath,
    ["--expose-gc", "--import", "tsx", thisFile, ...process.argv.slice(2)],
    {
      stdio: "inherit",
      cwd: process.cwd()
    }
  )
  process.exit(rerun.status ?? 1)
}

const { values: options } = parseArgs({
  options: {
    users: { type: "string", default: "1000000" },
    "idle-users": { type: "string", default: "100000" },
    out: { type: "string" }
  }
})
const manyUsers = Number(options.users)
const idleUsers = Number(options["idle-users"])

/** Loads every user as never seen and forgets every write: only the coordinator's own memory remains. */
const discardingStore: StoreShape = {
  loadUsers: (users) => Effect.succeed(new Map(users.map((user) => [user, emptyStoredUser]))),
  write: () => Effect.void,
  writesCheckpointed: true,
  checkpoint: (_partition, _known, through, _published) => Effect.succeed(through),
  openPartition: () => Effect.succeed({ nextPosition: 1 }),
  recall: () => Effect.succeed({ holds: [], adjustments: [] }),
  usersWithExpiries: () => Effect.succeed([]),
  pastUsage: () => Effect.succeed([]),
  listUsage: () => Effect.succeed({ usage: [], more: false }),
  ping: Effect.void
}
const discardingStoreLayer = Layer.succeed(Store, discardingStore)

interface MemorySample {
  readonly rssBytes: number
  readonly heapUsedBytes: number
  readonly externalBytes: number
}

const settledSample = async (): Promise<MemorySample> => {
  // Two collections with a turn of the event loop between: finalizers and weak refs settle.
  for (let round = 0; round < 2; round += 1) {
    gc!()
    await new Promise((resolve) => setImmediate(resolve))
  }
  const usage = process.memoryUsage()
  return { rssBytes: usage.rss, heapUsedBytes: usage.heapUsed, externalBytes: usage.external }
}

const commandsPerSubmitMax = 2_000

/** Sends every command of `commandsOf(user)` for each user, users in chunks; returns when all answered. */
const sendForUsers = (
  users: number,
  prefix: string,
  commandsOf: (user: string) => ReadonlyArray<Command>,
  onProgress: (done: number) => void
) =>
  Effect.gen(function* () {
    const coordinator = yield* Coordinator
    let unexpected = 0
    let index = 0
    while (index < users) {
      const commands: Array<Command> = []
      while (index < users && commands.length < commandsPerSubmitMax) {
        commands.push(...commandsOf(`${prefix}${index}`))
        index += 1
      }
      const results = yield* coordinator.submitAll(commands)
      for (const result of results) {
        if (
          result.status === "unavailable" ||
          result.status === "overloaded" ||
          result.status === "invalid_request"
        )
          unexpected += 1
      }
      onProgress(index)
    }
    return { unexpected, resident: coordinator.residentActors() }
  })

/** Users sent through before the baseline sample, so JIT and lazily built structures are in it. */
const warmUsers = 100

const getUsage = (user: string): ReadonlyArray<Command> => [{ op: "get_usage", user }]
const reserveAndCommit = (user: string): ReadonlyArray<Command> => [
  { op: "reserve", user, meter: "tokens", amount: 10, id: "job", ttlMs: 3_600_000 },
  { op: "commit", user, id: "job", amount: 7 }
]

const progressLine = (label: string) => (done: number) => {
  if (done % 50_000 !== 0 && done !== manyUsers) return
  process.stderr.write(
    process.stderr.isTTY === true ? `\r${label}: ${done} users` : `${label}: ${done} users\n`
  )
}

interface IdleResult {
  readonly label: string
  readonly users: number
  readonly resident: number
  readonly unexpected: number
  readonly heapPerActorBytes: number
  readonly rssPerActorBytes: number
}

const measureIdle = async (
  label: string,
  store: Layer.Layer<Store>,
  commandsOf: (user: string) => ReadonlyArray<Command>
): Promise<IdleResult> => {
  const layer = coordinatorLayer({
    config: defaultConfig,
    residentActorsMax: idleUsers + warmUsers,
    sweepIntervalMs: 0
  }).pipe(Layer.provide(store))
  return Effect.runPromise(
    Effect.scoped(
      Effect.gen(function* () {
        yield* sendForUsers(warmUsers, `${label}-warm-`, commandsOf, () => {})
        const before = yield* Effect.promise(settledSample)
        const sent = yield* sendForUsers(idleUsers, `${label}-`, commandsOf, progressLine(label))
        const after = yield* Effect.promise(settledSample)
        process.stderr.write("\n")
        const actors = Math.max(1, sent.resident - warmUsers)
        return {
          label,
          users: idleUsers,
          resident: sent.resident,
          unexpected: sent.unexpected,
          heapPerActorBytes: (after.heapUsedBytes - before.heapUsedBytes) / actors,
          rssPerActorBytes: (after.rssBytes - before.rssBytes) / actors
        }
      }).pipe(Effect.provide(layer))
    )
  )
}

interface ManyResult {
  readonly users: number
  readonly resident: number
  readonly unexpected: number
  readonly seconds: number
  readonly before: MemorySample
  readonly after: MemorySample
  readonly rssPeakBytes: number
}

const measureMany = async (): Promise<ManyResult> => {
  const layer = coordinatorLayer({ config: defaultConfig, residentActorsMax, sweepIntervalMs: 0 }).pipe(
    Layer.provide(discardingStoreLayer)
  )
  let rssPeakBytes = 0
  const sampler = setInterval(() => {
    rssPeakBytes = Math.max(rssPeakBytes, process.memoryUsage.rss())
  }, 50)
  try {
    return await Effect.runPromise(
      Effect.scoped(
        Effect.gen(function* () {
          const before = yield* Effect.promise(settledSample)
          const started = performance.now()
          const sent = yield* sendForUsers(
            manyUsers,
            "many-",
            reserveAndCommit,
            progressLine("distinct users")
          )
          const seconds = (performance.now() - started) / 1000
          const after = yield* Effect.promise(settledSample)
          process.stderr.write("\n")
          return {
            users: manyUsers,
            resident: sent.resident,
            unexpected: sent.unexpected,
            seconds,
            before,
            after,
            rssPeakBytes
          }
        }).pipe(Effect.provide(layer))
      )
    )
  } finally {
    clearInterval(sampler)
  }
}

const mib = (bytes: number) => (bytes / 2 ** 20).toFixed(1)

const main = async () => {
  const startedAt = new Date()
  const machine = machineInfo()
  const idle = [
    await measureIdle("idle-get-usage", memoryStoreLayer(), getUsage),
    await measureIdle("idle-one-hold", discardingStoreLayer, reserveAndCommit)
  ]
  const many = await measureMany()
  const lines = [
    `# quota-coordinator memory, ${startedAt.toISOString().replace("T", " ").slice(0, 16)} UTC`,
    "",
    `Machine: ${machine.cpuModel}, ${machine.cores} cores, ${machine.memoryGiB} GiB, Node ${machine.node}, ${machine.platform}. Load average at start: ${os
      .loadavg()
      .map((load) => load.toFixed(2))
      .join(", ")}. Code: ${machine.code}.`,
    "In process: the coordinator's layers only (no NATS, no Postgres); heap and RSS read after `global.gc()`.",
    "",
    "## Resident memory per idle actor",
    "",
    "| actors made | how | resident after | heap per actor | RSS per actor | unexpected results |",
    "| --- | --- | --- | --- | --- | --- |",
    ...idle.map(
      (result) =>
        `| ${result.users} | ${result.label === "idle-get-usage" ? "one `get_usage` each, `memoryStoreLayer()` (no rows written)" : "reserve 10 + commit 7 each (one closed hold remembered, one usage row), discarding store"} | ${result.resident} | ${Math.round(result.heapPerActorBytes)} B | ${Math.round(result.rssPerActorBytes)} B | ${result.unexpected} |`
    ),
    "",
    `## ${many.users.toLocaleString("en-US")} distinct users seen`,
    "",
    `Each user: reserve 10 + commit 7 (one message's worth: ${commandsPerSubmitMax} commands per submitAll). Resident actors capped at ${residentActorsMax.toLocaleString("en-US")} (the default): the least recently used idle actor is evicted for each new user past the cap. Store: loads every user empty, discards writes (the memory store would keep every user's rows and measure itself).`,
    "",
    "| users seen | resident at end | seconds | RSS before | RSS after (gc) | RSS peak | heap before | heap after (gc) | unexpected results |",
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    `| ${many.users} | ${many.resident} | ${many.seconds.toFixed(1)} | ${mib(many.before.rssBytes)} MiB | ${mib(many.after.rssBytes)} MiB | ${mib(many.rssPeakBytes)} MiB | ${mib(many.before.heapUsedBytes)} MiB | ${mib(many.after.heapUsedBytes)} MiB | ${many.unexpected} |`,
    ""
  ]
  const markdown = lines.join("\n")
  const directory = options.out ?? join(root, "bench", "results")
  await mkdir(directory, { recursive: true })
  const file = join(directory, `${startedAt.toISOString().slice(0, 10)}-memory.md`)
  await writeFile(file, markdown)
  process.stdout.write(`${markdown}\n`)
  process.stderr.write(`memory: wrote ${file}\n`)
}

main().then(
  () => process.exit(0),
  (error: unknown) => {
    process.stderr.write(
      `memory: failed: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`
    )
    process.exit(1)
  }
)
