/**
 * The publisher on its own (src/events/EventPublisher.ts), over the real Postgres partition log and
 * real NATS servers: it publishes a partition's events in log order and counts a row as published once
 * the stream acknowledged all of it; a partition this process may no longer serve publishes nothing
 * more; while JetStream is away it keeps the events, retries, and warns at most once per interval, not
 * per event; and a publisher that starts where another left off sends again only what the stream may
 * lack.
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
import { partitionOf } from "../../src/domain/partition.js"
import type { PublishedEvent } from "../../src/events/EventQueue.js"
import { EventQueue } from "../../src/events/EventQueue.js"
import { makeEventPublisher } from "../../src/events/EventPublisher.js"
import { makeJetStreamSink } from "../../src/events/JetStreamSink.js"
import type { MetricsRecorder } from "../../src/ops/MetricsRecorder.js"
import { noMetrics } from "../../src/ops/MetricsRecorder.js"
import { migrate } from "../../src/store/postgres/migrate.js"
import type { PostgresStore } from "../../src/store/postgres/PostgresStore.js"
import { makePostgresStore } from "../../src/store/postgres/PostgresStore.js"
import { acquireScoped, createTestSchema } from "../support/database.js"
import { appendRows, eventLogOf, limitChanged, logRows } from "../support/eventLog.js"
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

const startPublisher = (
  prefix: string,
  connection: NatsConnection,
  queue: EventQueue,
  options: {
    servable?: () => boolean
    warn?: (message: string) => void
    inFlightMax?: number
    metrics?: MetricsRecorder
  } = {}
) =>
  acquireScoped(
    makeEventPublisher({
      log: eventLogOf(database.pool(), database.schema, store.value),
      sink: makeJetStreamSink(connection, prefix, {
        ...eventSettingsDefaults,
        maxBytes: testEventsMaxBytes,
        enabled: true,
        streamName: `${prefix.toUpperCase()}_EVENTS`,
        outboxPerPartitionMax: 100,
        usageRecorded: true
      }),
      queue,
      prefix,
      servable: options.servable ?? (() => true),
      metrics: options.metrics ?? noMetrics,
      warn: options.warn ?? (() => {}),
      duplicateWindowMs: eventSettingsDefaults.duplicateWindowMs,
      ...(options.inFlightMax === undefined ? {} : { inFlightMax: options.inFlightMax })
    })
  )

/** The limits of the stream's messages, in stream order. */
const streamLimits = async (stream: string): Promise<Array<number>> => {
  const manager = await jetstreamManager(nc)
  const info = await manager.streams.info(stream).catch(() => undefined)
  const limits: Array<number> = []
  if (info === undefined || info.state.messages === 0) return limits
  for (let seq = info.state.first_seq; seq <= info.state.last_seq; seq += 1) {
    const message = await manager.streams.getMessage(stream, { seq })
    if (message !== null) limits.push(message.json<{ limit: number }>().limit)
  }
  return limits
}

describe("the publisher", () => {
  it("publishes in log order and counts a row published once acknowledged; a lost partition publishes nothing", async () => {
    const prefix = randomPrefix("pub")
    const stream = `${prefix.toUpperCase()}_EVENTS`
    const user = userOn(5, "pub")
    // Twelve events in four rows: the 10th must come after the 9th (read back in position order).
    const written = Array.from({ length: 12 }, (_, index) => index + 1)
    const rows = [0, 1, 2, 3].map((row) =>
      written.slice(row * 3, row * 3 + 3).map((limit) => limitChanged(user, limit))
    )
    await appendRows(store.value, 5, "a1", 1, rows)
    let servable = false
    const queue = new EventQueue(100)
    const warnings: Array<string> = []
    const publisher = await startPublisher(prefix, nc, queue, {
      servable: () => servable,
      warn: (message) => warnings.push(message),
      inFlightMax: 5
    })
    queue.listen(publisher.value.wake)
    await Effect.runPromise(publisher.value.start([5]))
    // Not servable (another process owns partition 5 now): nothing leaves, nothing counts as published.
    await sleep(500)
    expect(await streamLimits(stream)).toEqual([])
    expect(queue.of(5)).toBe(12)
    expect(queue.publishedThrough(5, 4)).toBe(0)

    servable = true
    await waitFor(
      async () => (queue.of(5) === 0 ? true : undefined),
      5_000,
      () => "the events were not published"
    )
    expect(await streamLimits(stream)).toEqual(written)
    expect(queue.publishedThrough(5, 4)).toBe(4)
    expect(warnings).toEqual([])
    // A checkpoint that knows it deletes the rows: they are in the tables and in the stream.
    await Effect.runPromise(store.value.checkpoint(5, [], 4, queue.publishedThrough(5, 4), 0))
    expect(await logRows(database.pool(), database.schema, 5)).toBe(0)
    await publisher.close()
    await (await jetstreamManager(nc)).streams.delete(stream)
  })

  it("keeps the events while JetStream is away, retrying, and warns once, not per event or partition", async () => {
    const prefix = randomPrefix("away")
    const awayConnection = await connect({ servers: withoutJetStream.url })
    for (const partition of [10, 11, 12]) {
      const user = userOn(partition, "away")
      await appendRows(store.value, partition, "b1", 1, [[limitChanged(user, 1), limitChanged(user, 2)]])
    }
    const queue = new EventQueue(100)
    const warnings: Array<string> = []
    const publisher = await startPublisher(prefix, awayConnection, queue, {
      warn: (message) => warnings.push(message)
    })
    await Effect.runPromise(publisher.value.start([10, 11, 12]))
    await sleep(3_000)
    expect(warnings).toEqual(["events are not being published; they wait in the log"])
    expect(queue.total()).toBe(6)
    for (const partition of [10, 11, 12]) {
      expect(queue.publishedThrough(partition, 1)).toBe(0)
      // Nothing counts as published: a checkpoint keeps the rows.
      await Effect.runPromise(
        store.value.checkpoint(partition, [], 1, queue.publishedThrough(partition, 1), 0)
      )
      expect(await logRows(database.pool(), database.schema, partition)).toBe(1)
    }
    await publisher.close()
    await awayConnection.close()
  })

  it("holds at most its memory's share of events, reads the rest from the log, and publishes every one in order", async () => {
    const prefix = randomPrefix("bounded")
    const stream = `${prefix.toUpperCase()}_EVENTS`
    const partition = 30
    const user = userOn(partition, "bounded")
    // 600 rows of 2 events in the log before the publisher starts (more than two reads of 256 rows),
    // then 40 appended as an actor does while it publishes.
    const rowsBefore = Array.from({ length: 600 }, (_, row) => [
      limitChanged(user, 2 * row + 1),
      limitChanged(user, 2 * row + 2)
    ])
    await appendRows(store.value, partition, "f1", 1, rowsBefore)
    const queue = new EventQueue(100_000, 10)
    let heldMost = 0
    const watch = setInterval(() => {
      heldMost = Math.max(
        heldMost,
        queue.rows(partition).reduce((sum, row) => sum + row.events.length, 0)
      )
    }, 1)
    const publisher = await startPublisher(prefix, nc, queue, { inFlightMax: 4 })
    await Effect.runPromise(publisher.value.start([partition]))
    for (let row = 0; row < 40; row += 1) {
      const position = 601 + row
      const events = [limitChanged(user, 2 * (position - 1) + 1), limitChanged(user, 2 * (position - 1) + 2)]
      await appendRows(store.value, partition, "f1", position, [events])
      queue.appended(partition, { position, token: "f1", events: events as Array<PublishedEvent> })
      // Nothing past an unpublished row counts as published.
      const through = queue.publishedThrough(partition, position)
      if (through !== undefined) expect(through).toBeLessThan(position)
    }
    await waitFor(
      async () => (queue.idle() ? true : undefined),
      30_000,
      () => "not all published"
    )
    clearInterval(watch)
    expect(await streamLimits(stream)).toEqual(Array.from({ length: 1_280 }, (_, index) => index + 1))
    expect(queue.publishedThrough(partition, 640)).toBe(640)
    // A read of the log is 256 rows (512 events here) past the share of 10.
    expect(heldMost).toBeLessThanOrEqual(10 + 512)
    await publisher.close()
    await (await jetstreamManager(nc)).streams.delete(stream)
  }, 60_000)

  it("a publisher that starts where another left off sends again only what the stream may lack", async () => {
    const prefix = randomPrefix("restart")
    const stream = `${prefix.toUpperCase()}_EVENTS`
    const user = userOn(20, "restart")
    const limits = Array.from({ length: 9 }, (_, index) => index + 1)
    await appendRows(
      store.value,
      20,
      "c1",
      1,
      [0, 1, 2].map((row) => limits.slice(row * 3, row * 3 + 3).map((limit) => limitChanged(user, limit)))
    )
    const first = await startPublisher(prefix, nc, new EventQueue(100), { inFlightMax: 4 })
    await Effect.runPromise(first.value.start([20]))
    await waitFor(
      async () => ((await streamLimits(stream)).length === 9 ? true : undefined),
      5_000,
      () => "the events were not published"
    )
    await first.close()
    // Nothing recorded them as published (no checkpoint ran): the next publisher reads all nine back.
    // With at most 4 in flight, the five before the stream's last event were acknowledged before it was
    // sent: only the three just before it (and nothing after) may be missing, and are sent again.
    const sent: Array<boolean> = []
    const metrics: MetricsRecorder = {
      ...noMetrics,
      eventPublished: (_kind, duplicate) => sent.push(duplicate)
    }
    const second = await startPublisher(prefix, nc, new EventQueue(100), { inFlightMax: 4, metrics })
    await Effect.runPromise(second.value.start([20]))
    await waitFor(
      async () => (sent.length === 3 ? true : undefined),
      5_000,
      () => `sent again: ${JSON.stringify(sent)}`
    )
    await sleep(300)
    // Within the duplicate window: the stream keeps one copy of each.
    expect(sent).toEqual([true, true, true])
    expect(await streamLimits(stream)).toEqual(limits)
    await second.close()
    await (await jetstreamManager(nc)).streams.delete(stream)
  })
})
