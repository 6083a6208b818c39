/**
 * Events survive a crash (PROTOCOL.md "Events": recorded with the change, none lost): a `serve` child
 * process is killed with SIGKILL while it publishes a backlog of events, and a new one is started on
 * the same database. Once the outbox is empty, the stream holds the event of every change the clients
 * had acknowledged exactly once (the new owner re-published what the dead one had sent but not yet
 * removed, under the same ids, and the stream's duplicate window kept one copy), in decision order
 * per user; a change that was in flight at the kill is there at most once.
 */
import { connect } from "@nats-io/transport-node"
import type { NatsConnection } from "@nats-io/transport-node"
import { jetstreamManager } from "@nats-io/jetstream"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { partitionOf } from "../../src/domain/partition.js"
import { sample, scrape, sleep, waitFor } from "../support/operations.js"
import type { ServeProcess, TestDatabase } from "../support/processes.js"
import { outboxRowCount, streamMessageCount } from "../support/eventStreams.js"
import { createTestDatabase, randomPrefix, startServe, stopServe } from "../support/processes.js"

const partitions = 8
const users = Array.from({ length: 40 }, (_, index) => `evc-${index}`)
const prefix = randomPrefix("evcrash")
const stream = `${prefix.toUpperCase()}_EVENTS`
let database: TestDatabase
let nc: NatsConnection
const serves: Array<ServeProcess> = []

beforeAll(async () => {
  database = await createTestDatabase("evcrash")
  nc = await connect({ servers: "127.0.0.1:4222" })
})

afterAll(async () => {
  for (const serve of serves) await stopServe(serve, "SIGKILL")
  await (await jetstreamManager(nc)).streams.delete(stream).catch(() => undefined)
  await nc?.close()
  await database?.drop()
})

const env = () => ({
  DATABASE_URL: database.url,
  QUOTA_PREFIX: prefix,
  QUOTA_PARTITIONS: String(partitions),
  QUOTA_LEASE_MS: "1000",
  LOG_LEVEL: "warn"
})

const outboxRows = (): Promise<number> => outboxRowCount(database.pool)
const streamCount = (): Promise<number> => streamMessageCount(nc, stream)

/** set_limit to `limit`: one limit_changed event, acknowledged when the answer is ok. */
const setLimit = async (user: string, limit: number): Promise<string> => {
  try {
    const reply = await nc.request(
      `${prefix}.v1.${partitionOf(user, partitions)}.admin`,
      JSON.stringify({ op: "set_limit", user, meter: "tokens", limit }),
      { timeout: 2_000 }
    )
    return reply.json<{ status: string }>().status
  } catch {
    return "no answer"
  }
}

describe("events across a SIGKILL", () => {
  it("the stream ends with every acknowledged change's event exactly once, in order per user", async () => {
    const first = startServe({ ...env(), LOG_LEVEL: "info" })
    serves.push(first)
    await Promise.race([first.ready, first.exited.then(() => Promise.reject(new Error(first.output())))])

    // Each user's limits go 1, 2, 3 ...: a change per step, one user's steps one after another.
    const acknowledged = new Map<string, Array<number>>()
    const sent = new Map<string, number>()
    let stopping = false
    const worker = async (user: string) => {
      for (let limit = 1; !stopping; limit += 1) {
        sent.set(user, limit)
        const status = await setLimit(user, limit)
        if (status === "ok") acknowledged.set(user, [...(acknowledged.get(user) ?? []), limit])
        else if (status !== "unavailable") break
      }
    }
    const load = Promise.all(users.map(worker))
    // Kill while it publishes: events in the stream already, and a backlog still in the outbox.
    const atKill = await waitFor(
      async () => {
        const [published, waiting] = [await streamCount(), await outboxRows()]
        return published >= 200 && waiting >= 50 ? { published, waiting } : undefined
      },
      30_000,
      async () => `stream ${await streamCount()}, outbox ${await outboxRows()}`
    )
    first.child.kill("SIGKILL")
    await first.exited
    stopping = true
    await load

    const second = startServe({ ...env(), LOG_LEVEL: "info" })
    serves.push(second)
    await Promise.race([second.ready, second.exited.then(() => Promise.reject(new Error(second.output())))])
    await waitFor(
      async () => ((await outboxRows()) === 0 ? true : undefined),
      30_000,
      async () => `outbox still has ${await outboxRows()} rows`
    )
    await sleep(200)
    const secondPort = second.httpPort()
    const republished =
      secondPort === undefined
        ? undefined
        : sample(await scrape(secondPort), "quota_events_republished_total")

    const manager = await jetstreamManager(nc)
    const info = await manager.streams.info(stream)
    const seen = new Map<string, Array<number>>()
    const ids = new Set<string>()
    let duplicateIds = 0
    for (let seq = info.state.first_seq; seq <= info.state.last_seq; seq += 1) {
      const message = await manager.streams.getMessage(stream, { seq })
      if (message === null) continue
      const event = message.json<{ eventId: string; user: string; event: string; limit: number }>()
      if (ids.has(event.eventId)) duplicateIds += 1
      ids.add(event.eventId)
      expect(event.event).toBe("limit_changed")
      seen.set(event.user, [...(seen.get(event.user) ?? []), event.limit])
    }
    const missing: Array<string> = []
    const repeated: Array<string> = []
    const outOfOrder: Array<string> = []
    for (const user of users) {
      const published = seen.get(user) ?? []
      for (const limit of acknowledged.get(user) ?? [])
        if (!published.includes(limit)) missing.push(`${user}:${limit}`)
      if (new Set(published).size !== published.length) repeated.push(user)
      if (published.some((limit, index) => index > 0 && limit <= published[index - 1]!)) outOfOrder.push(user)
      // Anything beyond the acknowledged was at most the one change in flight at the kill.
      const beyond = published.filter((limit) => !(acknowledged.get(user) ?? []).includes(limit))
      expect(
        beyond.every((limit) => limit === sent.get(user)),
        `${user}: ${JSON.stringify(beyond)}`
      ).toBe(true)
    }
    const acknowledgedCount = [...acknowledged.values()].reduce((sum, limits) => sum + limits.length, 0)
    console.log(
      `events crash: at the kill ${atKill.published} published and ${atKill.waiting} waiting in the outbox; ` +
        `${acknowledgedCount} changes acknowledged, ${info.state.messages} events in the stream, ` +
        `${missing.length} missing, ${repeated.length} users with a repeat, ${duplicateIds} duplicate ids; ` +
        `the new owner published again ${String(republished)} events the stream already had`
    )
    expect(missing).toEqual([])
    expect(repeated).toEqual([])
    expect(duplicateIds).toBe(0)
    expect(outOfOrder.map((user) => `${user}: ${JSON.stringify(seen.get(user))}`)).toEqual([])
    expect(await stopServe(second)).toBe(0)
  })
})
