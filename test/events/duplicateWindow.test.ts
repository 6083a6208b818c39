/**
 * Events exactly once without relying on JetStream's duplicate window (issue 19, item 5). The publisher
 * removes outbox rows only after publishing them; when Postgres is away between the two for longer than
 * the stream's duplicate window, the same ids published again are new messages to the stream. Here the
 * window is 300 ms and the outbox's removal fails for well past it: first for the publisher that
 * published the rows (an outage), then for a fresh publisher of another "process" that finds the rows
 * still in the outbox (a crash after publishing). Each event must be in the stream once. And (issue 26,
 * item 5) a publish stored by the stream whose acknowledgement was lost, retried past the window.
 */
import { connect } from "@nats-io/transport-node"
import type { NatsConnection } from "@nats-io/transport-node"
import { jetstreamManager } from "@nats-io/jetstream"
import { Effect } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { eventSettingsDefaults } from "../../src/config/eventSettings.js"
import type { StoreEvent } from "../../src/domain/events.js"
import { partitionOf } from "../../src/domain/partition.js"
import { makeEventPublisher } from "../../src/events/EventPublisher.js"
import type { OutboxShape } from "../../src/events/Outbox.js"
import type { EventSinkShape } from "../../src/events/JetStreamSink.js"
import { EventsUnavailable, makeJetStreamSink } from "../../src/events/JetStreamSink.js"
import { OutboxCounts } from "../../src/events/OutboxCounts.js"
import { noMetrics } from "../../src/ops/MetricsRecorder.js"
import { migrate } from "../../src/store/postgres/migrate.js"
import { makePostgresOutbox } from "../../src/store/postgres/outbox.js"
import type { PostgresStore } from "../../src/store/postgres/PostgresStore.js"
import { makePostgresStore } from "../../src/store/postgres/PostgresStore.js"
import { StoreUnavailable } from "../../src/store/Store.js"
import { acquireScoped, createTestSchema } from "../support/database.js"
import { testEventsMaxBytes } from "../support/eventStreams.js"
import { sleep, waitFor } from "../support/operations.js"
import { randomPrefix } from "../support/processes.js"

const database = createTestSchema("duplicate_window")
const partitions = 64
const partition = 7
const natsUrl = process.env["NATS_URL"] ?? "nats://127.0.0.1:4222"
const duplicateWindowMs = 300
let store: { value: PostgresStore; close: () => Promise<void> }
let nc: NatsConnection

beforeAll(async () => {
  const pool = database.pool()
  await Effect.runPromise(migrate(pool, database.schema))
  store = await acquireScoped(makePostgresStore({ pool, schema: database.schema, partitions }))
  nc = await connect({ servers: natsUrl })
})

afterAll(async () => {
  await nc?.close()
  await store?.close()
  await database.drop()
})

const userOn = (label: string): string => {
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

/** The real outbox, whose removal fails while `away` is set (Postgres unreachable for the publisher). */
const outboxAwayWhile = (away: { value: boolean }): OutboxShape => {
  const real = makePostgresOutbox(
    database.pool(),
    database.schema,
    1_790_000_000_000,
    store.value.readSettled
  )
  return {
    ...real,
    remove: (seqs) =>
      away.value
        ? Effect.fail(new StoreUnavailable({ reason: "the database is away (test)" }))
        : real.remove(seqs)
  }
}

const startPublisher = (
  prefix: string,
  outbox: OutboxShape,
  wrapSink: (sink: EventSinkShape) => EventSinkShape = (sink) => sink
) =>
  acquireScoped(
    makeEventPublisher({
      outbox,
      sink: wrapSink(
        makeJetStreamSink(nc, prefix, {
          ...eventSettingsDefaults,
          maxBytes: testEventsMaxBytes,
          enabled: true,
          streamName: `${prefix.toUpperCase()}_EVENTS`,
          outboxPerPartitionMax: 100,
          usageRecorded: true,
          duplicateWindowMs
        })
      ),
      counts: new OutboxCounts(100),
      prefix,
      servable: () => true,
      metrics: noMetrics,
      warn: () => {},
      pollIntervalMs: 100
    })
  )

/** The limits of the stream's messages, in stream order. */
const streamLimits = async (stream: string): Promise<Array<number>> => {
  const manager = await jetstreamManager(nc)
  const info = await manager.streams.info(stream)
  const limits: Array<number> = []
  for (let seq = info.state.first_seq; seq <= info.state.last_seq && info.state.messages > 0; seq += 1) {
    const message = await manager.streams.getMessage(stream, { seq })
    if (message !== null) limits.push(message.json<{ limit: number }>().limit)
  }
  return limits
}

const outboxEmpty = async (): Promise<true | undefined> =>
  (
    await Effect.runPromise(
      makePostgresOutbox(database.pool(), database.schema, 1_790_000_000_000, store.value.readSettled).read(
        partition,
        100
      )
    )
  ).length === 0
    ? true
    : undefined

describe("events past the duplicate window", () => {
  it("are not published again when their removal failed for longer than the window", async () => {
    const prefix = randomPrefix("dupwin")
    const stream = `${prefix.toUpperCase()}_EVENTS`
    const user = userOn("outage")
    await Effect.runPromise(store.value.write([1, 2, 3, 4].map((limit) => limitChanged(user, limit))))
    const away = { value: true }
    const publisher = await startPublisher(prefix, outboxAwayWhile(away))
    await Effect.runPromise(publisher.value.start([partition]))
    // Published, not removed; retried with backoff for several windows.
    await sleep(6 * duplicateWindowMs + 1_000)
    away.value = false
    await waitFor(outboxEmpty, 15_000, () => "the outbox was not emptied")
    expect(await streamLimits(stream)).toEqual([1, 2, 3, 4])
    await publisher.close()

    // A crash after publishing, then another process's publisher, long after the window.
    await Effect.runPromise(store.value.write([5, 6].map((limit) => limitChanged(user, limit))))
    const first = await startPublisher(prefix, outboxAwayWhile({ value: true }))
    await Effect.runPromise(first.value.start([partition]))
    await waitFor(
      async () => ((await streamLimits(stream)).length === 6 ? true : undefined),
      5_000,
      () => "5 and 6 were not published"
    )
    await first.close()
    await sleep(2 * duplicateWindowMs)
    const second = await startPublisher(prefix, outboxAwayWhile({ value: false }))
    await Effect.runPromise(second.value.start([partition]))
    await waitFor(outboxEmpty, 5_000, () => "the outbox was not emptied")
    expect(await streamLimits(stream)).toEqual([1, 2, 3, 4, 5, 6])
    await second.close()
    await (await jetstreamManager(nc)).streams.delete(stream)
  }, 40_000)

  it("are not published again when an acknowledgement was lost and the retry came past the window", async () => {
    const prefix = randomPrefix("lostack")
    const stream = `${prefix.toUpperCase()}_EVENTS`
    const user = userOn("lostack")
    await Effect.runPromise(store.value.write([1, 2, 3].map((limit) => limitChanged(user, limit))))
    // The first publish is stored, but its acknowledgement never comes back: the publisher hears of a
    // failure (a timeout) only after the duplicate window has passed.
    let publishes = 0
    const ackLostOnce = (sink: EventSinkShape): EventSinkShape => ({
      ...sink,
      publish: (subject, body, eventId) => {
        publishes += 1
        if (publishes > 1) return sink.publish(subject, body, eventId)
        return Effect.andThen(
          sink.publish(subject, body, eventId),
          Effect.andThen(
            Effect.sleep(2 * duplicateWindowMs),
            Effect.fail(new EventsUnavailable({ reason: "the acknowledgement was lost (test)" }))
          )
        )
      }
    })
    const publisher = await startPublisher(prefix, outboxAwayWhile({ value: false }), ackLostOnce)
    await Effect.runPromise(publisher.value.start([partition]))
    await waitFor(outboxEmpty, 10_000, () => "the outbox was not emptied")
    expect(publishes).toBeGreaterThan(1)
    expect(await streamLimits(stream)).toEqual([1, 2, 3])
    await publisher.close()
    await (await jetstreamManager(nc)).streams.delete(stream)
  }, 20_000)
})
