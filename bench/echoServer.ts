/**
 * The NATS ceiling's far side, run as its own process like the coordinator: answers every request on
 * `{prefix}.v1.*.ops` with its own bytes. No parsing, no decision, no database: what is left is NATS
 * request/reply and the client's own JSON work, the most any NATS service of this shape can do here.
 *
 * Usage: tsx bench/echoServer.ts <prefix>   (prints "ready" on stdout once subscribed)
 */
import { connect } from "@nats-io/transport-node"

const prefix = process.argv[2]
if (prefix === undefined) {
  process.stderr.write("usage: echoServer.ts <prefix>\n")
  process.exit(2)
}
const nc = await connect({
  servers: process.env["BENCH_NATS_URL"] ?? "nats://127.0.0.1:4222",
  name: "bench-echo"
})
nc.subscribe(`${prefix}.v1.*.ops`, {
  callback: (_error, msg) => {
    msg.respond(msg.data)
  }
})
await nc.flush()
process.stdout.write("ready\n")
const stop = () => {
  void nc.drain().then(() => process.exit(0))
}
process.once("SIGTERM", stop)
process.once("SIGINT", stop)
