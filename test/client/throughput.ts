/**
 * Throughput of the client against an echo responder in a child process (not a test; run it by hand):
 *
 *     npx tsx test/client/throughput.ts [commands] [inFlightMax]
 *
 * Compares coalescing (the default) with one command per message (`batchCommandsMax: 1`) and with
 * one command at a time, all on the nats-server at 127.0.0.1:4222. The responder answers every
 * command `reserved` at once, so the numbers measure the client and NATS, not a coordinator.
 */
import { spawn } from "node:child_process"
import { randomUUID } from "node:crypto"
import { fileURLToPath } from "node:url"
import { connect } from "@nats-io/transport-node"
import { QuotaClient } from "../../src/client/index.js"

const natsUrl = "nats://127.0.0.1:4222"
const partitions = 64

const runResponder = async (prefix: string): Promise<void> => {
  const nc = await connect({ servers: natsUrl })
  nc.subscribe(`${prefix}.v1.*.ops`, {
    callback: (_error, msg) => {
      const commands = msg.json<Array<{ id: string }>>()
      msg.respond(JSON.stringify(commands.map((command) => ({ status: "reserved", id: command.id }))))
    }
  })
  await nc.flush()
  process.stdout.write("ready\n")
}

/** Issues `total` reserves with at most `inFlightMax` outstanding; returns commands per second. */
const measure = async (client: QuotaClient, total: number, inFlightMax: number, label: string) => {
  let issued = 0
  const startedAt = performance.now()
  const lane = async () => {
    while (issued < total) {
      const index = issued++
      const result = await client.reserve({
        user: `user-${index % 10_000}`,
        meter: "tokens",
        amount: 1,
        id: `${index}`
      })
      if (result.status !== "reserved" || result.id !== `${index}`)
        throw new Error(`mismatched result ${index}`)
    }
  }
  await Promise.all(Array.from({ length: inFlightMax }, lane))
  const seconds = (performance.now() - startedAt) / 1_000
  const counters = client.counters()
  const perSecond = Math.round(total / seconds)
  const perMessage = (counters.commandsSent / counters.messagesSent).toFixed(1)
  console.log(
    `${label}: ${perSecond} commands/s, ${counters.messagesSent} messages, ${perMessage} commands/message`
  )
}

const main = async () => {
  const [mode, prefixArgument] = process.argv.slice(2)
  if (mode === "responder") return runResponder(prefixArgument!)
  const total = Number(process.argv[2] ?? 200_000)
  const inFlightMax = Number(process.argv[3] ?? 2_048)
  const prefix = `qcbench${randomUUID().slice(0, 8)}`
  const responder = spawn(
    process.execPath,
    [...process.execArgv, fileURLToPath(import.meta.url), "responder", prefix],
    {
      stdio: ["ignore", "pipe", "inherit"]
    }
  )
  await new Promise<void>((resolve) => responder.stdout.once("data", () => resolve()))
  try {
    const options = { servers: natsUrl, prefix, partitions }
    const runs: Array<[string, number, number, object]> = [
      ["coalesced", total, inFlightMax, {}],
      ["one command per message", Math.min(total, 50_000), inFlightMax, { batchCommandsMax: 1 }],
      ["one command at a time", Math.min(total, 5_000), 1, {}]
    ]
    for (const [label, commands, inFlight, extra] of runs) {
      const client = await QuotaClient.connect({ ...options, ...extra })
      await measure(client, commands, inFlight, `${label} (${commands} commands, ${inFlight} in flight)`)
      await client.close()
    }
  } finally {
    responder.kill()
  }
}

await main()
