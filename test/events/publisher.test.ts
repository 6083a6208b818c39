/**
 * The publisher on its own (src/events/EventPublisher.ts), over the real Postgres outbox and real NATS
 * servers: it publishes a partition's events in recording order and removes them once acknowledged;
 * a partition this process may no longer serve publishes nothing more; and while JetStream is away it
 * keeps the events, retries, and warns at most once per interval, not per event.
 */
import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { connect } from "@nats-io/transport-node"
import type { NatsConnection } from "@nats-io/transport-node"
import { jetstreamManager } from "@nats-io/jetstream"
import { Effect } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { eventSettingsDefaults } from "../../src/config/eventSettings.js"
import type { StoreEvent } from "../../src/domain/events.js"
import { partitionOf } from "../../src/domain/partition.js"
import { makeEventPublisher } from "../../src/events/EventPublisher.js"
import { makeJetStreamSink } from "../../src/events/JetStreamSink.js"
import { OutboxCounts } from "../../src/events/OutboxCounts.js"
import { noMetrics } from "../../src/ops/MetricsRecorder.js"
import { migrate } from "../../src/store/postgres/migrate.js"
import { makePostgresOutbox } from "../../src/store/postgres/outbox.js"
import type { PostgresStore } from "../../src/store/postgres/PostgresStore.js"
import { makePostgresStore } from "../../src/store/postgres/PostgresStore.js"
import { acquireScoped, createTestSchema } from "../support/database.js"
import { testEventsMaxBytes } from "../support/eventStreams.js"
import { sleep, waitFor } from "../support/operations.js"
import type { NatsServerProcess } from "../support/natsServerProcess.js"
import { startNatsServer } from "../support/natsServerProcess.js"
import { randomPrefix } from "../support/processes.js"

const database = createTestSchema("publisher")
const partitions = 64
const natsUrl = process.env["NATS_URL"] ?? "nats://127.0.0.1:4222"
let store: { value: PostgresStore; close: () => Promise<void> }
let nc: NatsConnection
let dir: string
let withoutJetStream: NatsServerProcess

beforeAll(async () => {
  const pool = database.pool()
  await Effect.runPromise(migrate(pool, database.schema))
  store = await acquireScoped(makePostgresStore({ pool, schema: database.schema, partitions }))
  nc = await connect({ servers: natsUrl })
  dir = await mkdtemp(join(tmpdir(), "quota-publisher-"))
  withoutJetStream = await startNatsServer(dir, (port) => `listen: 127.0.0.1:${port}\n`)
})

afterAll(async () => {
  await nc?.close()
  await withoutJetStream?.stop()
  await store?.close()
  await database.drop()
  await rm(dir, { recursive: true, force: true })
})

/** A user of `partition`. */
const userOn = (partition: number, label: string): string => {
  for (let index = 0; ; index += 1) {
    const user = `${label}-${index}`
    if (partitionOf(user, partitions) === partition) return user
  }
}

const limitChanged = (user: string, limit: number): StoreEvent => ({
  kind: "event",
  user,
  event: { event: "limit_changed", at: 1_790_000_000_000, meter: "tokens", limit }
})

const outbox = () =>
  makePostgresOutbox(database.pool(), database.schema, 1_790_000_000_000, store.value.readSettled)

describe("the publisher", () => {
  it("publishes in recording order and removes what the stream acknowledged; a lost partition publishes nothing", async () => {
    const prefix = randomPrefix("pub")
    const stream = `${prefix.toUpperCase()}_EVENTS`
    const user = userOn(5, "pub")
    // Twelve: the 10th must come after the 9th (an outbox read once ordered them as text).
    const written = Array.from({ length: 12 }, (_, index) => index + 1)
    await Effect.runPromise(store.value.write(written.map((limit) => limitChanged(user, limit))))
    let servable = false
    const counts = new OutboxCounts(100)
    const warnings: Array<string> = []
    const publisher = await acquireScoped(
      makeEventPublisher({
        outbox: outbox(),
        sink: makeJetStreamSink(nc, prefix, {
          ...eventSettingsDefaults,
          maxBytes: testEventsMaxBytes,
          enabled: true,
          streamName: stream,
          outboxPerPartitionMax: 100,
          usageRecorded: true
        }),
        counts,
        prefix,
        servable: () => servable,
        metrics: noMetrics,
        warn: (message) => warnings.push(message),
        pollIntervalMs: 100
      })
    )
    await Effect.runPromise(publisher.value.start([5]))
    // Not servable (another process owns partition 5 now): nothing leaves, nothing is removed.
    await sleep(500)
    const manager = await jetstreamManager(nc)
    const none = await manager.streams.info(stream).then(
      (info) => info.state.messages,
      () => 0
    )
    expect(none).toBe(0)
    expect((await Effect.runPromise(outbox().read(5, 100))).length).toBe(12)
    expect(counts.of(5)).toBe(12)

    servable = true
    await waitFor(
      async () => ((await Effect.runPromise(outbox().read(5, 100))).length === 0 ? true : undefined),
      5_000,
      () => "the outbox was not emptied"
    )
    const info = await manager.streams.info(stream)
    const limits: Array<number> = []
    for (let seq = info.state.first_seq; seq <= info.state.last_seq; seq += 1) {
      const message = await manager.streams.getMessage(stream, { seq })
      if (message !== null) limits.push(message.json<{ limit: number }>().limit)
    }
    expect(limits).toEqual(written)
    expect(counts.of(5)).toBe(0)
    expect(warnings).toEqual([])
    await publisher.close()
    await manager.streams.delete(stream)
  })

  it("keeps the events while JetStream is away, retrying, and warns once, not per event or partition", async () => {
    const prefix = randomPrefix("away")
    const awayConnection = await connect({ servers: withoutJetStream.url })
    const users = [10, 11, 12].map((partition) => userOn(partition, "away"))
    await Effect.runPromise(
      store.value.write(users.flatMap((user) => [limitChanged(user, 1), limitChanged(user, 2)]))
    )
    const counts = new OutboxCounts(100)
    const warnings: Array<string> = []
    const publisher = await acquireScoped(
      makeEventPublisher({
        outbox: outbox(),
        sink: makeJetStreamSink(awayConnection, prefix, {
          ...eventSettingsDefaults,
          maxBytes: testEventsMaxBytes,
          enabled: true,
          streamName: `${prefix.toUpperCase()}_EVENTS`,
          outboxPerPartitionMax: 100,
          usageRecorded: true
        }),
        counts,
        prefix,
        servable: () => true,
        metrics: noMetrics,
        warn: (message) => warnings.push(message),
        pollIntervalMs: 100
      })
    )
    await Effect.runPromise(publisher.value.start([10, 11, 12]))
    await sleep(3_000)
    expect(warnings).toEqual(["events are not being published; they wait in the outbox"])
    expect(counts.total()).toBe(6)
    for (const partition of [10, 11, 12])
      expect((await Effect.runPromise(outbox().read(partition, 10))).length).toBe(2)
    await publisher.close()
    await awayConnection.close()
  })
})
