/**
 * The durable echo, a reference point for the latency floors (floors.ts), run as its own process like
 * the coordinator: answers every request on `{prefix}.v1.*.ops` with its own bytes, but only after one
 * hold-shaped row per command is committed (fsync'd) in Postgres, through the coordinator's own group
 * commit (src/store/GroupCommit.ts, with its limits): requests that arrive in one synchronous run share
 * a commit, with at most storeWritersMax commits in flight. It decides nothing and keeps no state; unlike the coordinator it writes a row for
 * every command (the coordinator writes none for a refusal, up to three for a commit) and does not
 * hold a user's second write until the first is durable.
 *
 * Usage: tsx bench/durableEchoServer.ts <prefix> <database url>   (prints "ready" once subscribed)
 */
import { connect } from "@nats-io/transport-node"
import type { Msg } from "@nats-io/transport-node"
import { Cause, Effect, Exit, Scope } from "effect"
import { storeEventsPerCommitMax, storeWritersMax } from "../src/domain/limits.js"
import { makeGroupCommit } from "../src/store/GroupCommit.js"
import { holdInsertText, holdKeys, holdTableDdl } from "./lib/holdRows.js"
import { makePool } from "./targets/pgCommon.js"

const [prefix, connectionString] = process.argv.slice(2)
if (prefix === undefined || connectionString === undefined) {
  process.stderr.write("usage: durableEchoServer.ts <prefix> <database url>\n")
  process.exit(2)
}
const schema = `bench_durable_echo_${process.pid}`
const pool = makePool(connectionString, storeWritersMax)
await pool.query(holdTableDdl(schema))
const insert = { name: "durable_echo_insert", text: holdInsertText(schema) }

let sequence = 0
const scope = Effect.runSync(Scope.make())
const groupCommit = await Effect.runPromise(
  makeGroupCommit<null, unknown>({
    // One row per item; the group's rows go in one autocommitted insert.
    commit: (items) =>
      Effect.tryPromise({
        try: async () => {
          const keys = holdKeys(items.length, sequence)
          sequence = keys.sequence
          await pool.query({ ...insert, values: [keys.users, keys.ids, Date.now()] })
        },
        catch: (error) => error
      }),
    itemsPerCommitMax: storeEventsPerCommitMax,
    closed: () => new Error("durable echo stopped"),
    writersMax: storeWritersMax
  }).pipe(Scope.provide(scope))
)

/** Commands in a message: a batch is a JSON array (PROTOCOL.md); anything else is one command. */
const commandsIn = (msg: Msg): number => {
  try {
    const body: unknown = JSON.parse(msg.string())
    return Array.isArray(body) ? Math.max(1, body.length) : 1
  } catch {
    return 1
  }
}

const answerWhenDurable = (msg: Msg): void => {
  const rows = new Array<null>(commandsIn(msg)).fill(null)
  Effect.runCallback(groupCommit.submit(rows), {
    onExit: (exit) => {
      // No reply after a failed commit: the client's request times out and counts as an error.
      if (Exit.isFailure(exit)) {
        process.stderr.write(`durable echo: commit failed: ${String(Cause.squash(exit.cause))}\n`)
        return
      }
      try {
        msg.respond(msg.data)
      } catch (error) {
        process.stderr.write(`durable echo: reply failed: ${String(error)}\n`)
      }
    }
  })
}

const nc = await connect({
  servers: process.env["BENCH_NATS_URL"] ?? "nats://127.0.0.1:4222",
  name: "bench-durable-echo"
})
nc.subscribe(`${prefix}.v1.*.ops`, {
  callback: (_error, msg) => answerWhenDurable(msg)
})
await nc.flush()
process.stdout.write("ready\n")
const stop = () => {
  void nc
    .drain()
    .then(() => Effect.runPromise(Scope.close(scope, Exit.void)))
    .then(() => pool.query(`drop schema ${schema} cascade`))
    .finally(() => process.exit(0))
}
process.once("SIGTERM", stop)
process.once("SIGINT", stop)
