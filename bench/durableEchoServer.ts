/**
 * The durable echo, a reference point for the latency floors (floors.ts), run as its own process like
 * the coordinator: answers every request on `{prefix}.v1.*.ops` with its own bytes, but only after one
 * hold-shaped row per command is committed (fsync'd) in Postgres. Requests that arrive in one
 * synchronous run share a commit, with at most storeWritersMax commits in flight, as the coordinator's
 * group commit does. It decides nothing and keeps no state; unlike the coordinator it writes a row for
 * every command (the coordinator writes none for a refusal, up to three for a commit) and does not
 * hold a user's second write until the first is durable.
 *
 * Usage: tsx bench/durableEchoServer.ts <prefix> <database url>   (prints "ready" once subscribed)
 */
import { connect } from "@nats-io/transport-node"
import type { Msg } from "@nats-io/transport-node"
import { storeEventsPerCommitMax, storeWritersMax } from "../src/domain/limits.js"
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

interface Waiting {
  readonly msg: Msg
  readonly rows: number
}
const pending: Array<Waiting> = []
let writers = 0
let groupScheduled = false
let sequence = 0

/** Commands in a message: a batch is a JSON array (PROTOCOL.md); anything else is one command. */
const commandsIn = (msg: Msg): number => {
  try {
    const body: unknown = JSON.parse(msg.string())
    return Array.isArray(body) ? Math.max(1, body.length) : 1
  } catch {
    return 1
  }
}

const startGroups = () => {
  groupScheduled = false
  while (writers < storeWritersMax && pending.length > 0) {
    let rows = 0
    let count = 0
    while (
      count < pending.length &&
      (count === 0 || rows + pending[count]!.rows <= storeEventsPerCommitMax)
    ) {
      rows += pending[count]!.rows
      count += 1
    }
    const group = pending.splice(0, count)
    writers += 1
    void commitGroup(group, rows).finally(() => {
      writers -= 1
      scheduleGroup()
    })
  }
}

const scheduleGroup = () => {
  if (groupScheduled || pending.length === 0) return
  groupScheduled = true
  queueMicrotask(startGroups)
}

const commitGroup = async (group: ReadonlyArray<Waiting>, rows: number): Promise<void> => {
  const keys = holdKeys(rows, sequence)
  sequence = keys.sequence
  try {
    await pool.query({ ...insert, values: [keys.users, keys.ids, Date.now()] })
  } catch (error) {
    // No reply: the client's request times out and counts as an error, as a lost write must.
    process.stderr.write(`durable echo: commit failed: ${String(error)}\n`)
    return
  }
  for (const waiting of group) {
    try {
      waiting.msg.respond(waiting.msg.data)
    } catch (error) {
      process.stderr.write(`durable echo: reply failed: ${String(error)}\n`)
    }
  }
}

const nc = await connect({
  servers: process.env["BENCH_NATS_URL"] ?? "nats://127.0.0.1:4222",
  name: "bench-durable-echo"
})
nc.subscribe(`${prefix}.v1.*.ops`, {
  callback: (_error, msg) => {
    pending.push({ msg, rows: commandsIn(msg) })
    scheduleGroup()
  }
})
await nc.flush()
process.stdout.write("ready\n")
const stop = () => {
  void nc
    .drain()
    .then(() => pool.query(`drop schema ${schema} cascade`))
    .finally(() => process.exit(0))
}
process.once("SIGTERM", stop)
process.once("SIGINT", stop)
