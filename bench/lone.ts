/**
 * A lone request against its floor (issue 21, goal 1): one request in flight at a time, the service as
 * deployed (`serve` with its defaults, on a fresh database of its own) interleaved with its floors in
 * the same run, each on the same NATS and Postgres: `get_usage` against a bare NATS echo
 * (echoServer.ts: no parsing, no decision), `reserve` and `commit` against the durable echo
 * (durableEchoServer.ts: one row committed in Postgres, fsync'd, then the reply). Rounds go
 * get_usage, echo, reserve, durable echo, commit, durable echo, so drift on the shared machine touches
 * both sides alike. Prints p50 and p99 of each and the ratios of p50s.
 *
 *   npx tsx bench/lone.ts [--rounds 360] [--warmup 40] [--out FILE]
 */
import { randomBytes } from "node:crypto"
import { writeFile } from "node:fs/promises"
import { parseArgs } from "node:util"
import { connect } from "@nats-io/transport-node"
import type { NatsConnection } from "@nats-io/transport-node"
import { partitionOf } from "../src/domain/partition.js"
import { startCoordinator } from "./targets/coordinatorProcess.js"
import { startEchoProcess } from "./targets/echoProcess.js"
import { natsUrl } from "./targets/natsTarget.js"
import { databaseUrl } from "./targets/pgCommon.js"

const { values: options } = parseArgs({
  options: {
    rounds: { type: "string", default: "360" },
    warmup: { type: "string", default: "40" },
    out: { type: "string" }
  }
})
const rounds = Number(options.rounds)
const warmup = Number(options.warmup)

const percentile = (sorted: ReadonlyArray<number>, fraction: number): number =>
  sorted[Math.min(sorted.length - 1, Math.floor(fraction * sorted.length))] ?? Number.NaN

const timed = async (nc: NatsConnection, subject: string, body: string): Promise<number> => {
  const startedAt = performance.now()
  const reply = await nc.request(subject, body, { timeout: 10_000 })
  const ms = performance.now() - startedAt
  const text = reply.string()
  if (text.includes('"unavailable"') || text.includes('"overloaded"')) throw new Error(`refused: ${text}`)
  return ms
}

const coordinator = await startCoordinator(process.cwd())
const tag = randomBytes(4).toString("hex")
const echoPrefix = `bench_lone_echo_${tag}`
const durablePrefix = `bench_lone_durable_${tag}`
const echo = await startEchoProcess(process.cwd(), "echoServer.ts", [echoPrefix])
const durable = await startEchoProcess(process.cwd(), "durableEchoServer.ts", [
  durablePrefix,
  databaseUrl(coordinator.database)
])
const nc = await connect({ servers: natsUrl, name: "bench-lone" })
const samples = {
  get_usage: [] as Array<number>,
  echo: [] as Array<number>,
  reserve: [] as Array<number>,
  commit: [] as Array<number>,
  durableForReserve: [] as Array<number>,
  durableForCommit: [] as Array<number>
}
try {
  for (let round = 0; round < warmup + rounds; round += 1) {
    // Eight users in turn, met in the warm-up: resident, loaded, their day's period floor recorded. A
    // user's first command of a day costs a load and a write; that is not what a lone request costs.
    const user = `lone-${tag}-${round % 8}`
    const partition = partitionOf(user, coordinator.partitions)
    const ops = `${coordinator.prefix}.v1.${partition}.ops`
    const id = `h${round}`
    const hold = JSON.stringify({ op: "reserve", user, meter: "work", amount: 1, id })
    const measured = round >= warmup
    const take = (list: Array<number>, ms: number) => {
      if (measured) list.push(ms)
    }
    take(samples.get_usage, await timed(nc, ops, JSON.stringify({ op: "get_usage", user })))
    take(
      samples.echo,
      await timed(nc, `${echoPrefix}.v1.${partition}.ops`, JSON.stringify({ op: "get_usage", user }))
    )
    take(samples.reserve, await timed(nc, ops, hold))
    take(samples.durableForReserve, await timed(nc, `${durablePrefix}.v1.${partition}.ops`, hold))
    take(samples.commit, await timed(nc, ops, JSON.stringify({ op: "commit", user, id })))
    take(samples.durableForCommit, await timed(nc, `${durablePrefix}.v1.${partition}.ops`, hold))
  }
} finally {
  await nc.close()
  await durable.stop()
  await echo.stop()
  await coordinator.stop()
}

const summary = (list: Array<number>) => {
  const sorted = [...list].sort((left, right) => left - right)
  return { p50: percentile(sorted, 0.5), p99: percentile(sorted, 0.99) }
}
const rows: Array<[string, { p50: number; p99: number }, string, { p50: number; p99: number }]> = [
  ["get_usage", summary(samples.get_usage), "NATS echo", summary(samples.echo)],
  ["reserve", summary(samples.reserve), "durable echo", summary(samples.durableForReserve)],
  ["commit", summary(samples.commit), "durable echo", summary(samples.durableForCommit)]
]
const table = [
  `Lone requests, ${new Date().toISOString().slice(0, 10)}: ${rounds} rounds after ${warmup} of warm-up, one request in flight, ` +
    "the coordinator as deployed (its default settings and log level), floors interleaved in the same run.",
  "",
  "| request | p50 ms | p99 ms | floor | floor p50 ms | floor p99 ms | p50 / floor p50 (goal <= 1.3) |",
  "| --- | --- | --- | --- | --- | --- | --- |",
  ...rows.map(
    ([name, own, floor, floorTimes]) =>
      `| ${name} | ${own.p50.toFixed(3)} | ${own.p99.toFixed(3)} | ${floor} | ${floorTimes.p50.toFixed(3)} | ${floorTimes.p99.toFixed(3)} | ${(own.p50 / floorTimes.p50).toFixed(2)} |`
  ),
  ""
].join("\n")
console.log(table)
if (options.out !== undefined) await writeFile(options.out, table)
