/**
 * The sum rule of `usage_recorded` (PROTOCOL.md revision 1.3) through crashes: random workloads of
 * consume, commit (charges and refunds), adjust (up, down, below 0), retries and refusals run against
 * a `serve` child process that is killed with SIGKILL three times while it publishes; each time a new
 * one is started on the same database. Once the outbox is empty, per user and meter the amounts of the
 * stream's `usage_recorded` events (one per eventId) equal `used` as `get_usage` reports it and as
 * `list_usage` lists it, exactly.
 */
import { connect } from "@nats-io/transport-node"
import type { NatsConnection } from "@nats-io/transport-node"
import { jetstreamManager } from "@nats-io/jetstream"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { partitionOf } from "../../src/domain/partition.js"
import { waitFor } from "../support/operations.js"
import type { ServeProcess, TestDatabase } from "../support/processes.js"
import { outboxRowCount, streamMessageCount } from "../support/eventStreams.js"
import { createTestDatabase, randomPrefix, startServe, stopServe } from "../support/processes.js"

const partitions = 8
const users = Array.from({ length: 24 }, (_, index) => `urc-${index}-ü`)
const meters = ["analysis", "tokens", "storage_bytes"] as const
const kills = 3
const seed = Number(process.env["QUOTA_TEST_SEED"] ?? Date.now() % 1_000_000)
const prefix = randomPrefix("usagecrash")
const stream = `${prefix.toUpperCase()}_EVENTS`
let database: TestDatabase
let nc: NatsConnection
const serves: Array<ServeProcess> = []

/** mulberry32: the workload from `seed`, printed so that a failure can be replayed. */
const makeRandom = (start: number) => {
  let state = start >>> 0
  return (below: number): number => {
    state = (state + 0x6d2b79f5) >>> 0
    let value = state
    value = Math.imul(value ^ (value >>> 15), value | 1)
    value ^= value + Math.imul(value ^ (value >>> 7), value | 61)
    return Math.floor((((value ^ (value >>> 14)) >>> 0) / 4_294_967_296) * below)
  }
}

beforeAll(async () => {
  database = await createTestDatabase("usagecrash")
  nc = await connect({ servers: "127.0.0.1:4222" })
})

afterAll(async () => {
  for (const serve of serves) await stopServe(serve, "SIGKILL")
  await (await jetstreamManager(nc)).streams.delete(stream).catch(() => undefined)
  await nc?.close()
  await database?.drop()
})

const env = {
  QUOTA_PARTITIONS: String(partitions),
  QUOTA_LEASE_MS: "1000",
  // "claimed partitions", which startServe waits for, is logged at info.
  LOG_LEVEL: "info"
}

const start = async (): Promise<ServeProcess> => {
  const serve = startServe({ ...env, DATABASE_URL: database.url, QUOTA_PREFIX: prefix })
  serves.push(serve)
  await Promise.race([serve.ready, serve.exited.then(() => Promise.reject(new Error(serve.output())))])
  return serve
}

const request = async (
  kind: "ops" | "admin",
  partition: number,
  command: Record<string, unknown>
): Promise<Record<string, unknown>> => {
  try {
    const reply = await nc.request(`${prefix}.v1.${partition}.${kind}`, JSON.stringify(command), {
      timeout: 2_000
    })
    return reply.json<Record<string, unknown>>()
  } catch {
    return { status: "no answer" }
  }
}

const ops = (command: Record<string, unknown> & { user: string }) =>
  request("ops", partitionOf(command.user, partitions), command)

const outboxRows = (): Promise<number> => outboxRowCount(database.pool)
const streamCount = (): Promise<number> => streamMessageCount(nc, stream)

/** One user's workload step: a few commands, retried with the same ids whatever their answer. */
const step = async (user: string, random: (below: number) => number, index: number): Promise<void> => {
  const meter = meters[random(meters.length)]!
  const id = `${user}-${index}`
  switch (random(4)) {
    case 0: {
      // adjust: up or down, past 0 sometimes; sent twice (the retry records nothing).
      const amount = random(61) - 25
      await ops({ op: "adjust", user, meter, amount, id })
      await ops({ op: "adjust", user, meter, amount, id })
      return
    }
    case 1: {
      // reserve, consume twice (one a retry), commit above, below or at what was consumed.
      await ops({ op: "reserve", user, meter, amount: 20, id, ttlMs: 60_000 })
      const consumed = random(15)
      await ops({ op: "consume", user, id, amount: consumed, key: "k1" })
      await ops({ op: "consume", user, id, amount: consumed, key: "k1" })
      await ops({ op: "commit", user, id, amount: random(30) })
      await ops({ op: "commit", user, id })
      return
    }
    case 2: {
      // commit without amount: the hold's amount.
      await ops({ op: "reserve", user, meter, amount: 1 + random(9), id, ttlMs: 60_000 })
      await ops({ op: "commit", user, id })
      return
    }
    default:
      // A refusal: over the limit, nothing recorded.
      await ops({ op: "reserve", user, meter, amount: 10_000_000_000_000, id })
  }
}

/** Every `usage_recorded` of the stream, summed per user, meter and period; duplicates by eventId counted. */
const sumsOfStream = async () => {
  const manager = await jetstreamManager(nc)
  const info = await manager.streams.info(stream)
  const sums = new Map<string, number>()
  const ids = new Set<string>()
  let duplicateIds = 0
  let recorded = 0
  for (let seq = info.state.first_seq; seq <= info.state.last_seq; seq += 1) {
    const message = await manager.streams.getMessage(stream, { seq }).catch(() => null)
    if (message === null) continue
    const event = message.json<{
      eventId: string
      user: string
      event: string
      meter: string
      periodStart: number | null
      amount: number
    }>()
    if (event.event !== "usage_recorded") continue
    if (ids.has(event.eventId)) {
      duplicateIds += 1
      continue
    }
    ids.add(event.eventId)
    recorded += 1
    const key = `${event.user}|${event.meter}|${String(event.periodStart)}`
    sums.set(key, (sums.get(key) ?? 0) + event.amount)
  }
  return { sums, duplicateIds, recorded }
}

describe("usage_recorded across SIGKILLs", () => {
  it("per user, meter and period, the events' amounts add up to used (get_usage and list_usage)", async () => {
    console.log(`usage_recorded crash test: seed ${seed} (QUOTA_TEST_SEED=${seed} replays the workload)`)
    const random = makeRandom(seed)
    let serve = await start()
    let stopping = false
    const worker = async (user: string, userRandom: (below: number) => number) => {
      for (let index = 0; !stopping; index += 1) await step(user, userRandom, index)
    }
    const load = Promise.all(users.map((user, index) => worker(user, makeRandom(seed + index + 1))))
    for (let kill = 1; kill <= kills; kill += 1) {
      const target = (await streamCount()) + 150 + random(150)
      await waitFor(
        async () => ((await streamCount()) >= target ? true : undefined),
        60_000,
        async () => `kill ${kill}: stream ${await streamCount()} of ${target}, outbox ${await outboxRows()}`
      )
      const waiting = await outboxRows()
      serve.child.kill("SIGKILL")
      console.log(`kill ${kill}: stream ${await streamCount()}, outbox ${waiting} at the kill`)
      await serve.exited
      serve = await start()
    }
    stopping = true
    await load
    await waitFor(
      async () => ((await outboxRows()) === 0 ? true : undefined),
      30_000,
      async () => `outbox still has ${await outboxRows()} rows`
    )

    const { sums, duplicateIds, recorded } = await sumsOfStream()
    const mismatches: Array<string> = []
    const fromGetUsage = new Map<string, number>()
    for (const user of users) {
      const usage = await waitFor(
        async () => {
          const reply = await request("admin", partitionOf(user, partitions), { op: "get_usage", user })
          return reply["status"] === "ok" ? reply : undefined
        },
        10_000,
        () => `get_usage of ${user} did not answer ok`
      )
      for (const entry of usage["meters"] as Array<{
        meter: string
        periodStart: number | null
        used: number
      }>) {
        if (!(meters as ReadonlyArray<string>).includes(entry.meter)) continue
        const key = `${user}|${entry.meter}|${String(entry.periodStart)}`
        fromGetUsage.set(key, entry.used)
        if ((sums.get(key) ?? 0) !== entry.used)
          mismatches.push(`${key}: events ${sums.get(key) ?? 0}, get_usage ${entry.used}`)
      }
    }
    // list_usage over every partition, as a billing job walks them.
    const listed = new Map<string, number>()
    for (const meter of meters) {
      const periodStart =
        meter === "storage_bytes"
          ? undefined
          : [...fromGetUsage.keys()].find((key) => key.includes(`|${meter}|`))?.split("|")[2]
      for (let partition = 0; partition < partitions; partition += 1) {
        let after: string | undefined
        for (;;) {
          const reply = await request("admin", partition, {
            op: "list_usage",
            meter,
            limit: 5,
            ...(periodStart === undefined ? {} : { periodStart: Number(periodStart) }),
            ...(after === undefined ? {} : { after })
          })
          expect(reply["status"], JSON.stringify(reply)).toBe("ok")
          const page = reply["usage"] as Array<{ user: string; used: number }>
          for (const entry of page) listed.set(`${entry.user}|${meter}|${periodStart ?? "null"}`, entry.used)
          if (reply["more"] !== true) break
          after = page.at(-1)!.user
        }
      }
    }
    for (const [key, used] of fromGetUsage) {
      if ((listed.get(key) ?? 0) !== used)
        mismatches.push(`${key}: list_usage ${listed.get(key) ?? 0}, get_usage ${used}`)
    }
    console.log(
      `usage_recorded crash test: ${kills} kills, ${recorded} usage_recorded events, ${duplicateIds} duplicate ids, ` +
        `${fromGetUsage.size} user-meter totals compared, ${mismatches.length} mismatches`
    )
    expect(mismatches).toEqual([])
    expect(duplicateIds).toBe(0)
    expect(await stopServe(serve)).toBe(0)
  }, 240_000)
})
