/**
 * The floor of issue 27: everything the coordinator's request path does except deciding, run as its
 * own process like the coordinator, so the bench can set the two side by side on the same load.
 *
 * It is the coordinator's own NATS edge (src/transport/NatsServer.ts: the same `.ops` and `.admin`
 * subscriptions per partition, the queue group of one process of a scaled-out deployment, the same
 * body parsing, command decoding and partition check, reply assembly and micro service stats) over a
 * Coordinator that decides nothing. The commands enqueued in one synchronous run (a socket read's
 * messages) form one submission to the coordinator's group commit (src/store/GroupCommit.ts, with its
 * limits: up to storeWritersMax groups in flight); per group, one pipelined transaction: the epoch
 * fence of the partitions touched, the coordinator's own check (`assert_partition_epochs` on
 * `partition_owners`, from its migrations), then one appended row per partition touched holding that
 * partition's commands as JSON (bytea), commit. Once the group committed, each command is answered
 * with a well-formed result of its op's success status (`reserved` for a reserve...) whose numbers
 * come from the command, not from any state; reads (`get_usage`, `list_holds`) are answered at once
 * with empty state and write nothing. A failed commit answers its commands `unavailable`.
 *
 * What it leaves out of the coordinator's path, besides the decision: actors and their mailboxes,
 * the one-write-in-flight-per-user order, loading users, the events outbox and its publisher, the
 * ownership rounds. Kept: the per-command and per-commit metrics `serve` records (its /metrics is on
 * in the bench), though nothing serves them here.
 *
 * Usage: tsx bench/floorServer.ts <prefix> <database url> <partitions>   (prints "ready" once serving)
 */
import { Cause, Effect, Exit, Layer, Scope } from "effect"
import { Coordinator } from "../src/actors/Coordinator.js"
import type { CoordinatorShape } from "../src/actors/Coordinator.js"
import type { Reply } from "../src/actors/replies.js"
import type { Command } from "../src/domain/commands.js"
import { storeEventsPerCommitMax, storeWritersMax } from "../src/domain/limits.js"
import { partitionOf } from "../src/domain/partition.js"
import type { HoldResult, HoldStatus, Result } from "../src/domain/results.js"
import { unavailable } from "../src/domain/results.js"
import { makeGroupCommit } from "../src/store/GroupCommit.js"
import { withCheckedOutClient } from "../src/store/postgres/checkedOutClient.js"
import { migrate } from "../src/store/postgres/migrate.js"
import { identifyBackend } from "../src/store/postgres/outcomeDoubts.js"
import { poolConfig, scopedPool } from "../src/store/postgres/PostgresStore.js"
import { writeStatements } from "../src/store/postgres/writeEvents.js"
import { makePrometheusMetrics } from "../src/ops/PrometheusMetrics.js"
import { makeLogger } from "../src/transport/log.js"
import { natsServerLayer } from "../src/transport/NatsServer.js"
import { logAppendQueries, sendPipelined } from "./lib/logAppend.js"
import { meterLimits } from "./targets/Target.js"

const [prefix, connectionString, partitionsText] = process.argv.slice(2)
const partitions = Number(partitionsText)
if (prefix === undefined || connectionString === undefined || !Number.isInteger(partitions)) {
  process.stderr.write("usage: floorServer.ts <prefix> <database url> <partitions>\n")
  process.exit(2)
}
const schema = "floor"
const owner = `bench-floor-${process.pid}`
const epoch = 1
/** What a hold result shows as the meter's limit: the floor keeps no limits, nor any state. */
const limitShown = 1_000_000_000_000

/** A hold result built from the command alone (`meter` "" when the command names none). */
const holdResult = (
  status: HoldStatus,
  hold: { id: string; meter?: string; amount: number; state: HoldResult["state"]; expiresAt: number }
): HoldResult => ({
  status,
  meter: hold.meter ?? "",
  limit: limitShown,
  used: 0,
  reserved: hold.state === "pending" ? hold.amount : 0,
  available: limitShown - hold.amount,
  overage: 0,
  id: hold.id,
  amount: hold.amount,
  consumed: hold.state === "pending" ? 0 : hold.amount,
  state: hold.state,
  expiresAt: hold.expiresAt
})

/** The success result of `command`'s op, shaped as the coordinator's, decided by nothing. */
const floorResult = (command: Command, now: number): Result => {
  switch (command.op) {
    case "reserve":
      return holdResult("reserved", { ...command, state: "pending", expiresAt: now + command.ttlMs })
    case "consume":
      return holdResult("consumed", { ...command, state: "pending", expiresAt: now })
    case "commit":
      return holdResult("committed", {
        ...command,
        amount: command.amount ?? 0,
        state: "committed",
        expiresAt: now
      })
    case "release":
      return holdResult("released", { ...command, amount: 0, state: "released", expiresAt: now })
    case "extend":
      return holdResult("extended", {
        ...command,
        amount: 0,
        state: "pending",
        expiresAt: now + command.ttlMs
      })
    case "adjust":
      return {
        status: "adjusted",
        id: command.id,
        meter: command.meter,
        limit: limitShown,
        used: command.amount,
        reserved: 0,
        available: limitShown - command.amount,
        overage: 0
      }
    case "acquire_slot":
      return {
        status: "acquired",
        limit: null,
        held: 1,
        job: command.job,
        leaseExpiresAt: now + command.leaseMs
      }
    case "renew_slot":
      return {
        status: "renewed",
        limit: null,
        held: 1,
        job: command.job,
        leaseExpiresAt: now + command.leaseMs
      }
    case "release_slot":
      return { status: "released", limit: null, held: 0, job: command.job }
    case "get_usage":
      return { status: "ok", plan: "", meters: [], slots: { limit: null, held: 0, jobs: [], waiting: 0 } }
    case "list_holds":
      return { status: "ok", holds: [], more: false }
    case "usage_history":
      return { status: "ok", history: [] }
    case "set_plan":
    case "set_limit":
    case "tick":
      return { status: "ok" }
  }
}

/** Commands that change nothing in the coordinator's store either: answered at once, not appended. */
const isRead = (command: Command): boolean =>
  command.op === "get_usage" ||
  command.op === "list_holds" ||
  command.op === "usage_history" ||
  command.op === "tick"

interface Pending {
  readonly command: Command
  readonly reply: Reply
}

const scope = Effect.runSync(Scope.make())
const logger = makeLogger("info")
// The metrics `serve` records with its /metrics on (as the bench runs it): per command, per commit.
const metrics = makePrometheusMetrics({ meters: Object.keys(meterLimits), plans: ["free"] }).recorder

const floorCoordinator = Effect.gen(function* () {
  // The coordinator's pool as `serve` makes it (pipelined, its bounds), and its schema and fence table.
  const pool = yield* scopedPool(poolConfig(connectionString, undefined, true))
  yield* migrate(pool, schema)
  yield* Effect.promise(() =>
    pool.query(
      `create table "${schema}".command_log (partition integer not null, epoch bigint not null,
         seq bigserial primary key, commands bytea not null);
       insert into "${schema}".partition_owners
         select partition, '${owner}', ${epoch}, ${Number.MAX_SAFE_INTEGER} from generate_series(0, ${partitions - 1}) as partition`
    )
  )
  const append = {
    fence: writeStatements(schema).assertFence,
    table: `"${schema}".command_log`,
    bytesColumn: "commands",
    owner,
    epoch
  }

  const appendGroup = async (items: ReadonlyArray<Pending>): Promise<void> => {
    const byPartition = new Map<number, Array<Command>>()
    for (const { command } of items) {
      const partition = partitionOf(command.user, partitions)
      const list = byPartition.get(partition)
      if (list === undefined) byPartition.set(partition, [command])
      else list.push(command)
    }
    const rows = new Map<number, Uint8Array>()
    for (const [partition, commands] of byPartition)
      rows.set(partition, Buffer.from(JSON.stringify(commands)))
    await withCheckedOutClient(pool, async (client) => {
      // As the coordinator's store does before each group (cached per connection after the first).
      await identifyBackend(client)
      await sendPipelined(client, logAppendQueries(append, rows))
    })
  }

  const groupCommit = yield* makeGroupCommit<Pending, unknown>({
    commit: (items) =>
      Effect.tryPromise({
        try: async () => {
          const startedAt = performance.now()
          let ok = false
          try {
            await appendGroup(items)
            ok = true
          } finally {
            metrics.storeCommitted((performance.now() - startedAt) / 1_000, ok)
          }
        },
        catch: (error) => error
      }),
    itemsPerCommitMax: storeEventsPerCommitMax,
    writersMax: storeWritersMax,
    closed: () => new Error("the floor is stopping")
  })

  /** Commands enqueued in this synchronous run: one submission, made in a microtask after the first. */
  let turn: Array<Pending> = []
  const submitTurn = (): void => {
    const items = turn
    turn = []
    Effect.runCallback(groupCommit.submit(items), {
      onExit: (exit) => {
        if (Exit.isFailure(exit))
          logger.error({ error: String(Cause.squash(exit.cause)) }, "floor: append failed")
        const now = Date.now()
        for (const { command, reply } of items)
          reply(Exit.isSuccess(exit) ? floorResult(command, now) : unavailable)
      }
    })
  }
  const enqueue = (command: Command, reply: Reply): void => {
    if (isRead(command)) return reply(floorResult(command, Date.now()))
    if (turn.length === 0) queueMicrotask(submitTurn)
    turn.push({ command, reply })
  }
  const submit = (command: Command) =>
    Effect.callback<Result>((resume) => enqueue(command, (result) => resume(Effect.succeed(result))))
  const shape: CoordinatorShape = {
    submit,
    submitAll: (commands) => Effect.forEach(commands, submit, { concurrency: "unbounded" }),
    enqueue,
    enqueueIn: (_partition, command, reply) => enqueue(command, reply),
    // Billing's partition reads are no part of the bench's workloads.
    listUsage: (_command, reply) => reply({ status: "ok", usage: [], more: false }),
    sweepOnce: Effect.succeed(0),
    whenOpened: () => Effect.void,
    residentActors: () => 0,
    slotWaiters: () => 0,
    dropAllActors: Effect.void,
    dropPartitions: () => Effect.void,
    drainPartitions: () => Effect.succeed(true)
  }
  return shape
})

const server = natsServerLayer({
  servers: process.env["BENCH_NATS_URL"] ?? "nats://127.0.0.1:4222",
  prefix,
  partitions,
  logger,
  metrics,
  // As `serve` runs on Postgres (scaled out or not): a queue group of its own.
  queueGroup: "per-process"
}).pipe(Layer.provide(Layer.effect(Coordinator, floorCoordinator)))

await Effect.runPromise(Layer.build(server).pipe(Scope.provide(scope)))
process.stdout.write("ready\n")
const stop = () => {
  void Effect.runPromise(Scope.close(scope, Exit.void)).finally(() => process.exit(0))
}
process.once("SIGTERM", stop)
process.once("SIGINT", stop)
