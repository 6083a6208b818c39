/**
 * The write path alone, in process: the coordinator over the real Postgres store, driven through
 * `submitAll` (no NATS), reserve then commit for many users. Prints commands/s, commits/s and
 * commands and events per commit, the numbers group commit is about. Not a test.
 *
 *   npx tsx bench/store.ts [seconds=10] [users=10000] [inFlightBatches=64] [batchCommands=32]
 */
import { Context, Effect, Exit, Layer, Scope } from "effect"
import pg from "pg"
import { Coordinator, coordinatorLayer } from "../src/actors/Coordinator.js"
import type { Command } from "../src/domain/commands.js"
import { defaultConfig } from "../src/domain/config.js"
import { makePostgresStore, poolConfig, scopedPool } from "../src/store/postgres/PostgresStore.js"
import { migrate } from "../src/store/postgres/migrate.js"
import { Store } from "../src/store/Store.js"

const [seconds = 10, users = 10_000, inFlight = 64, batchCommands = 32] = process.argv.slice(2).map(Number)
const databaseUrl = process.env["DATABASE_URL"] ?? "postgres://postgres@127.0.0.1:5432/test"
const schema = `bench_store_${process.pid}`

const program = Effect.gen(function* () {
  const pool = yield* scopedPool(poolConfig(databaseUrl, 10, true))
  yield* migrate(pool, schema)
  const store = yield* makePostgresStore({ pool, schema, partitions: 64, pipelined: true })
  const context = yield* Layer.build(
    coordinatorLayer({ config: defaultConfig, sweepIntervalMs: 0 }).pipe(
      Layer.provide(Layer.succeed(Store, store))
    )
  )
  const coordinator = Context.get(context, Coordinator)
  let sequence = 0
  let commands = 0
  const deadline = Date.now() + seconds * 1_000
  const worker = Effect.gen(function* () {
    while (Date.now() < deadline) {
      const reserves: Array<Command> = []
      for (let index = 0; index < batchCommands; index += 1) {
        const id = sequence++
        reserves.push({
          op: "reserve",
          user: `user-${id % users}`,
          meter: "analysis",
          amount: 1,
          id: `h${id}`,
          ttlMs: 60_000
        })
      }
      const results = yield* coordinator.submitAll(reserves)
      const commits = reserves.flatMap((command, index): Array<Command> =>
        command.op === "reserve" && results[index]?.status === "reserved"
          ? [{ op: "commit", user: command.user, id: command.id, amount: 1 }]
          : []
      )
      yield* coordinator.submitAll(commits)
      commands += reserves.length + commits.length
    }
  })
  const before = yield* store.commitStats
  const startedAt = performance.now()
  yield* Effect.all(
    Array.from({ length: inFlight }, () => worker),
    { concurrency: "unbounded" }
  )
  const elapsedS = (performance.now() - startedAt) / 1_000
  const after = yield* store.commitStats
  const commits = after.commits - before.commits
  console.log(
    JSON.stringify({
      seconds: Number(elapsedS.toFixed(2)),
      users,
      inFlightBatches: inFlight,
      batchCommands,
      commandsPerSecond: Math.round(commands / elapsedS),
      commitsPerSecond: Math.round(commits / elapsedS),
      commandsPerCommit: Number((commands / commits).toFixed(1)),
      eventsPerCommit: Number(((after.items - before.items) / commits).toFixed(1)),
      largestCommitEvents: after.largestCommitItems,
      failedCommits: after.failedCommits - before.failedCommits
    })
  )
})

const scope = Effect.runSync(Scope.make())
await Effect.runPromise(Scope.provide(scope)(program))
await Effect.runPromise(Scope.close(scope, Exit.void))
const cleanup = new pg.Client({ connectionString: databaseUrl })
await cleanup.connect()
await cleanup.query(`drop schema if exists "${schema}" cascade`)
await cleanup.end()
