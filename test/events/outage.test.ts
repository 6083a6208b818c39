/**
 * JetStream away, then back (PROTOCOL.md "Events", issue's back-pressure): a `serve` whose NATS has no
 * JetStream keeps deciding, its events wait in the outbox (`quota_events_pending`), and past the
 * outbox's cap (QUOTA_EVENTS_OUTBOX_MAX, small here) a change that would record one more event of that
 * partition is refused `unavailable` while changes that record none go on. When the same server comes
 * back with JetStream, the coordinator reconnects by itself, creates the stream, and the backlog
 * arrives in order, once; the refused change, retried, is then accepted.
 */
import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { connect } from "@nats-io/transport-node"
import type { NatsConnection } from "@nats-io/transport-node"
import { jetstreamManager } from "@nats-io/jetstream"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { partitionOf } from "../../src/domain/partition.js"
import type { InProcessServe } from "../support/operations.js"
import { sample, scrape, startServeInProcess, waitFor } from "../support/operations.js"
import type { NatsServerProcess } from "../support/natsServerProcess.js"
import { freeLoopbackPort, startNatsServer } from "../support/natsServerProcess.js"
import type { TestDatabase } from "../support/processes.js"
import { createTestDatabase, randomPrefix } from "../support/processes.js"

const prefix = randomPrefix("outage")
const stream = `${prefix.toUpperCase()}_EVENTS`
const outboxMax = 3
let dir: string
let port: number
let nats: NatsServerProcess | undefined
let database: TestDatabase
let running: InProcessServe
let nc: NatsConnection

/** One server on a fixed port, with or without JetStream (ready when it says so in its log). */
const startNats = (jetStream: boolean) =>
  startNatsServer(
    dir,
    () => `listen: 127.0.0.1:${port}\n${jetStream ? `jetstream { store_dir: "${join(dir, "js")}" }\n` : ""}`
  )

/** Users of one partition, so the one partition's cap is what is reached. */
const usersOnOnePartition = (count: number): Array<string> => {
  const users: Array<string> = []
  for (let index = 0; users.length < count; index += 1) {
    const user = `out-${index}`
    if (partitionOf(user, 64) === 7) users.push(user)
  }
  return users
}

const request = async (kind: "ops" | "admin", command: Record<string, unknown> & { user: string }) =>
  (
    await nc.request(`${prefix}.v1.${partitionOf(command.user, 64)}.${kind}`, JSON.stringify(command), {
      timeout: 5_000
    })
  ).json<{ status: string }>()

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), "quota-outage-"))
  port = await freeLoopbackPort()
  nats = await startNats(false)
  database = await createTestDatabase("outage")
  running = await startServeInProcess({
    DATABASE_URL: database.url,
    NATS_URL: `nats://127.0.0.1:${port}`,
    QUOTA_PREFIX: prefix,
    QUOTA_LEASE_MS: "3000",
    QUOTA_EVENTS_OUTBOX_MAX: String(outboxMax)
  })
  nc = await connect({
    servers: `nats://127.0.0.1:${port}`,
    maxReconnectAttempts: -1,
    reconnectTimeWait: 100
  })
  await waitFor(
    async () => (sample(await scrape(running.httpPort), "quota_partitions_owned") === 64 ? true : undefined),
    20_000,
    () => "the coordinator did not claim all partitions"
  )
})

afterAll(async () => {
  await nc?.close()
  await running?.stop()
  await nats?.stop()
  await database?.drop()
  await rm(dir, { recursive: true, force: true })
})

describe("JetStream away", () => {
  it("decisions go on, events wait up to the cap, then arrive in order once JetStream is back", async () => {
    const users = usersOnOnePartition(outboxMax + 1)
    // Each change records one event (limit_changed) of partition 7.
    for (const user of users.slice(0, outboxMax)) {
      expect(await request("admin", { op: "set_limit", user, meter: "tokens", limit: 1_000 })).toEqual({
        status: "ok"
      })
    }
    const pending = await waitFor(
      async () => {
        const value = sample(await scrape(running.httpPort), "quota_events_pending")
        return value === outboxMax ? value : undefined
      },
      5_000,
      async () => `quota_events_pending is ${sample(await scrape(running.httpPort), "quota_events_pending")}`
    )
    expect(pending).toBe(outboxMax)

    // The cap: one more event of partition 7 is refused, and nothing of it is applied ...
    const last = users[outboxMax]!
    expect(await request("admin", { op: "set_limit", user: last, meter: "tokens", limit: 1_000 })).toEqual({
      status: "unavailable"
    })
    const usage = await request("ops", { op: "get_usage", user: last })
    expect((usage as unknown as { meters: Array<{ meter: string; limit: number }> }).meters[2]).toMatchObject(
      {
        meter: "tokens",
        limit: 400_000
      }
    )
    // ... while a change that records no event goes on.
    expect(
      await request("ops", { op: "reserve", user: last, meter: "tokens", amount: 5, id: "h" })
    ).toMatchObject({
      status: "reserved"
    })

    // JetStream comes back on the same address: the coordinator reconnects and publishes the backlog.
    // Cut off from NATS past natsLossGraceMs it gave its partitions up (ownership follows the ability to
    // serve), so it serves again once it has claimed them back; then the backlog drains.
    await nats!.stop()
    nats = await startNats(true)
    await waitFor(
      async () =>
        (await request("ops", { op: "get_usage", user: last }).then(
          (answer) => answer.status === "ok",
          () => false
        ))
          ? true
          : undefined,
      30_000,
      () => "the coordinator did not serve partition 7 again"
    )
    await waitFor(
      async () => (sample(await scrape(running.httpPort), "quota_events_pending") === 0 ? true : undefined),
      30_000,
      async () => `still pending: ${sample(await scrape(running.httpPort), "quota_events_pending")}`
    )
    // The refused change, retried, is accepted now.
    expect(await request("admin", { op: "set_limit", user: last, meter: "tokens", limit: 1_000 })).toEqual({
      status: "ok"
    })
    const manager = await jetstreamManager(nc)
    const events = await waitFor(
      async () => {
        const info = await manager.streams.info(stream)
        if (info.state.messages < outboxMax + 1) return undefined
        const bodies: Array<{ user: string; event: string; limit: number }> = []
        for (let seq = info.state.first_seq; seq <= info.state.last_seq; seq += 1) {
          const message = await manager.streams.getMessage(stream, { seq })
          if (message !== null) bodies.push(message.json())
        }
        return bodies
      },
      10_000,
      () => "the stream did not get the events"
    )
    expect(events.map((event) => [event.user, event.event, event.limit])).toEqual(
      users.map((user) => [user, "limit_changed", 1_000])
    )
  })
})
