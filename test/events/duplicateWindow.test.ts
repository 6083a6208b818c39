/**
 * Events exactly once without relying on JetStream's duplicate window (issue 19, item 5; issue 36). A
 * log row counts as published only once the stream acknowledged all of it, and rows stay in the log
 * until a checkpoint deletes them; a publisher that starts past the window (here 300 ms) on rows
 * another already published (a crash after publishing, before anything recorded it) must not send them
 * as new messages. And (issue 26, item 5) a publish stored by the stream whose acknowledgement was lost,
 * retried past the window.
 */
import { connect } from "@nats-io/transport-node"
import type { NatsConnection } from "@nats-io/transport-node"
import { jetstreamManager } from "@nats-io/jetstream"
import { Effect } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { eventSettingsDefaults } from "../../src/config/eventSettings.js"
import { partitionOf } from "../../src/domain/partition.js"
import { EventQueue } from "../../src/events/EventQueue.js"
import { makeEventPublisher } from "../../src/events/EventPublisher.js"
import type { EventSinkShape, PublishOutcome } from "../../src/events/JetStreamSink.js"
import { makeJetStreamSink } from "../../src/events/JetStreamSink.js"
import { noMetrics } from "../../src/ops/MetricsRecorder.js"
import { migrate } from "../../src/store/postgres/migrate.js"
import type { PostgresStore } from "../../src/store/postgres/PostgresStore.js"
import { makePostgresStore } from "../../src/store/postgres/PostgresStore.js"
import { acquireScoped, createTestSchema } from "../support/database.js"
import { appendRows, eventLogOf, limitChanged } from "../support/eventLog.js"
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

const userOn = (label: string, on = partition): string => {
  for (let index = 0; ; index += 1) {
    const user = `${label}-${index}`
    if (partitionOf(user, partitions) === on) return user
  }
}

const startPublisher = (
  prefix: string,
  queue: EventQueue,
  wrapSink: (sink: EventSinkShape) => EventSinkShape = (sink) => sink
) =>
  acquireScoped(
    makeEventPublisher({
      log: eventLogOf(database.pool(), database.schema, store.value),
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
      queue,
      prefix,
      servable: () => true,
      metrics: noMetrics,
      warn: () => {},
      duplicateWindowMs
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

/** The publisher read the log and the stream acknowledged everything it queued. */
const publishedAll = (queue: EventQueue) => async (): Promise<true | undefined> =>
  queue.idle() ? true : undefined

/** The second case's partition: the first's rows stay in partition 7's log. */
const otherPartition = 8

describe("events past the duplicate window", () => {
  it("are not published again by a publisher that starts past the window on rows already published", async () => {
    const prefix = randomPrefix("dupwin")
    const stream = `${prefix.toUpperCase()}_EVENTS`
    const user = userOn("outage")
    await appendRows(store.value, partition, "d1", 1, [
      [limitChanged(user, 1), limitChanged(user, 2)],
      [limitChanged(user, 3), limitChanged(user, 4)]
    ])
    const firstQueue = new EventQueue(100)
    const first = await startPublisher(prefix, firstQueue)
    await Effect.runPromise(first.value.start([partition]))
    await waitFor(publishedAll(firstQueue), 5_000, () => "1-4 were not published")
    expect(await streamLimits(stream)).toEqual([1, 2, 3, 4])
    await first.close()

    // A crash after publishing, then another process's publisher, long after the window: nothing
    // recorded the rows as published, so it reads them all back.
    await sleep(2 * duplicateWindowMs)
    await appendRows(store.value, partition, "d2", 3, [[limitChanged(user, 5), limitChanged(user, 6)]])
    const secondQueue = new EventQueue(100)
    const second = await startPublisher(prefix, secondQueue)
    await Effect.runPromise(second.value.start([partition]))
    await waitFor(publishedAll(secondQueue), 5_000, () => "5 and 6 were not published")
    await second.close()
    await sleep(2 * duplicateWindowMs)
    const thirdQueue = new EventQueue(100)
    const third = await startPublisher(prefix, thirdQueue)
    await Effect.runPromise(third.value.start([partition]))
    await waitFor(publishedAll(thirdQueue), 5_000, () => "the third publisher did not catch up")
    expect(await streamLimits(stream)).toEqual([1, 2, 3, 4, 5, 6])
    await third.close()
    await (await jetstreamManager(nc)).streams.delete(stream)
  }, 40_000)

  it("are not published again when an acknowledgement was lost and the retry came past the window", async () => {
    const prefix = randomPrefix("lostack")
    const stream = `${prefix.toUpperCase()}_EVENTS`
    const user = userOn("lostack", otherPartition)
    await appendRows(store.value, otherPartition, "e1", 10, [
      [limitChanged(user, 1), limitChanged(user, 2), limitChanged(user, 3)]
    ])
    // The first publishes are stored, but their acknowledgements never come back: the publisher hears
    // of a failure only after the duplicate window has passed.
    let attempts = 0
    const sentEvents: Array<number> = []
    const ackLostOnce = (sink: EventSinkShape): EventSinkShape => ({
      ...sink,
      publishAll: (events) => {
        attempts += 1
        sentEvents.push(events.length)
        if (attempts > 1) return sink.publishAll(events)
        return Effect.andThen(
          sink.publishAll(events),
          Effect.andThen(
            Effect.sleep(2 * duplicateWindowMs),
            Effect.succeed(events.map((): PublishOutcome => undefined))
          )
        )
      }
    })
    const queue = new EventQueue(100)
    const publisher = await startPublisher(prefix, queue, ackLostOnce)
    await Effect.runPromise(publisher.value.start([otherPartition]))
    await waitFor(publishedAll(queue), 10_000, () => "the events were not published")
    expect(attempts).toBeGreaterThan(1)
    // Found in the stream on the retry: nothing sent a second time.
    expect(sentEvents.slice(1).every((count) => count === 0)).toBe(true)
    expect(await streamLimits(stream)).toEqual([1, 2, 3])
    await publisher.close()
    await (await jetstreamManager(nc)).streams.delete(stream)
  }, 20_000)
})
