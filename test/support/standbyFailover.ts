/**
 * What the failover and restore tests of issue 34 share: a coordinator wired as `serve` wires it (the
 * Postgres store layer, its partition logs, the actors, their events queue) on a database URL (a
 * standby pair's of test/nemesis/standby.ts, or this machine's), an events publisher over those logs,
 * the events a stream holds, and what they say against the database.
 */
import { jetstreamManager } from "@nats-io/jetstream"
import type { NatsConnection } from "@nats-io/transport-node"
import { Context, Effect, Layer } from "effect"
import pg from "pg"
import { Coordinator, coordinatorLayer } from "../../src/actors/Coordinator.js"
import { eventSettingsDefaults } from "../../src/config/eventSettings.js"
import type { Command } from "../../src/domain/commands.js"
import { defaultConfig } from "../../src/domain/config.js"
import type { Result } from "../../src/domain/results.js"
import type { EventLogShape } from "../../src/events/EventLog.js"
import { EventLog } from "../../src/events/EventLog.js"
import type { EventPublisher } from "../../src/events/EventPublisher.js"
import { makeEventPublisher } from "../../src/events/EventPublisher.js"
import { EventQueue } from "../../src/events/EventQueue.js"
import { makeJetStreamSink } from "../../src/events/JetStreamSink.js"
import { noMetrics } from "../../src/ops/MetricsRecorder.js"
import { checkpointAll } from "../../src/store/postgres/partitionLog.js"
import { postgresStoreLayer } from "../../src/store/postgres/PostgresStore.js"
import { acquireScoped } from "./database.js"
import { testEventsMaxBytes } from "./eventStreams.js"
import { waitFor } from "./operations.js"

export interface TestCoordinator {
  readonly submit: (command: Command) => Promise<Result>
  readonly log: EventLogShape
  readonly queue: EventQueue
  readonly close: () => Promise<void>
}

/** A coordinator (one process's actors and store) on `url`, the store's query timeout shortened. */
export const coordinatorOn = async (
  url: string,
  options: {
    readonly prefix: string
    readonly partitions: number
    readonly queryTimeoutMs: number
    /** Default `quota`, as serve's. */
    readonly schema?: string
  }
): Promise<TestCoordinator> => {
  const queue = new EventQueue(10_000)
  const layer = coordinatorLayer({
    config: defaultConfig,
    sweepIntervalMs: 0,
    partitions: options.partitions,
    eventQueue: queue
  }).pipe(
    Layer.provideMerge(
      postgresStoreLayer({
        connectionString: url,
        ...(options.schema === undefined ? {} : { schema: options.schema }),
        prefix: options.prefix,
        partitions: options.partitions,
        queryTimeoutMs: options.queryTimeoutMs,
        eventQueue: queue
      })
    )
  )
  const built = await acquireScoped(
    Effect.map(Layer.build(layer), (context) => ({
      coordinator: Context.get(context, Coordinator),
      log: Context.get(context, EventLog)
    }))
  )
  return {
    submit: (command) => Effect.runPromise(built.value.coordinator.submit(command)),
    log: built.value.log,
    queue,
    close: built.close
  }
}

/** The events stream of `prefix` as serve names it. */
export const streamOf = (prefix: string): string => `${prefix.toUpperCase()}_EVENTS`

/** A publisher of every partition of `coordinator`'s logs, woken by its appends, as serve wires one. */
export const publisherOn = async (
  nc: NatsConnection,
  coordinator: Pick<TestCoordinator, "log" | "queue">,
  options: { readonly prefix: string; readonly partitions: number }
): Promise<{ readonly publisher: EventPublisher; readonly close: () => Promise<void> }> => {
  const built = await acquireScoped(
    makeEventPublisher({
      log: coordinator.log,
      sink: makeJetStreamSink(nc, options.prefix, {
        ...eventSettingsDefaults,
        maxBytes: testEventsMaxBytes,
        enabled: true,
        streamName: streamOf(options.prefix),
        outboxPerPartitionMax: 10_000,
        usageRecorded: true
      }),
      queue: coordinator.queue,
      prefix: options.prefix,
      servable: () => true,
      metrics: noMetrics,
      warn: () => {},
      duplicateWindowMs: eventSettingsDefaults.duplicateWindowMs
    })
  )
  coordinator.queue.listen(built.value.wake)
  await Effect.runPromise(
    built.value.start(Array.from({ length: options.partitions }, (_, partition) => partition))
  )
  return { publisher: built.value, close: built.close }
}

/**
 * Until `coordinator`'s publishers have read their logs and published everything, then a moment for
 * the last acknowledgements; and the tables at `url` brought up to the logs, for what reads them.
 */
export const everythingPublished = async (
  coordinator: Pick<TestCoordinator, "queue">,
  url: string,
  schema = "quota"
): Promise<void> => {
  await waitFor(
    async () => (coordinator.queue.idle() ? true : undefined),
    30_000,
    () => "the events were not all published"
  )
  await new Promise((resolve) => setTimeout(resolve, 500))
  const pool = new pg.Pool({ connectionString: url, max: 1 })
  try {
    await checkpointAll(pool, schema)
  } finally {
    await pool.end()
  }
}

/** An event as the stream holds it: its Nats-Msg-Id and its body's fields. */
export interface StreamEvent {
  readonly msgId: string
  readonly eventId: string
  readonly event: string
  readonly user: string
  readonly partition: number
  readonly meter?: string
  readonly periodStart?: number | null
  readonly amount?: number
  readonly ref?: string
}

/** Every message of `stream`, in stream order (none while it does not exist). */
export const streamEvents = async (nc: NatsConnection, stream: string): Promise<Array<StreamEvent>> => {
  const manager = await jetstreamManager(nc)
  const info = await manager.streams.info(stream).catch(() => undefined)
  if (info === undefined || info.state.messages === 0) return []
  const events: Array<StreamEvent> = []
  for (let seq = info.state.first_seq; seq <= info.state.last_seq; seq += 1) {
    const message = await manager.streams.getMessage(stream, { seq }).catch(() => null)
    if (message === null) continue
    events.push({
      ...message.json<Omit<StreamEvent, "msgId">>(),
      msgId: message.header?.get("Nats-Msg-Id") ?? ""
    })
  }
  return events
}

/** An adjust's change as the checks name it: `user/id`. */
export const changeOf = (event: Pick<StreamEvent, "user" | "ref">): string => `${event.user}/${event.ref}`

/** What the stream says against a database (adjusts only): the figures the tests compare. */
export interface StreamAgainstDatabase {
  /** `usage_recorded` events of adjusts the database does not have. */
  readonly eventsOfChangesTheDatabaseLacks: number
  /** Of the `acknowledged` changes (`user/id`), those with no event in the stream. */
  readonly acknowledgedWithoutEvent: number
  /** Event ids the stream holds more than once. */
  readonly idsTwice: number
  /** (user, meter, period)s whose `usage_recorded` amounts (one per eventId) do not add up to `used`. */
  readonly sumMismatches: number
}

export const streamAgainstDatabase = async (
  database: Pick<pg.ClientBase, "query">,
  schema: string,
  events: ReadonlyArray<StreamEvent>,
  acknowledged: ReadonlySet<string>
): Promise<StreamAgainstDatabase> => {
  const stored = new Set(
    (
      await database.query<{ change: string }>(
        `select user_id || '/' || key as change from "${schema}".usage_ledger where operation = 'adjust'`
      )
    ).rows.map((row) => row.change)
  )
  const used = new Map(
    (
      await database.query<{ meter_of: string; used: string }>(
        `select user_id || '|' || meter || '|' || period_start as meter_of, used::text from "${schema}".usage_totals`
      )
    ).rows.map((row) => [row.meter_of, Number(row.used)])
  )
  const recorded = events.filter((event) => event.event === "usage_recorded")
  const inStream = new Set(recorded.map(changeOf))
  const ids = new Map<string, number>()
  for (const event of events) ids.set(event.eventId, (ids.get(event.eventId) ?? 0) + 1)
  const sums = new Map<string, number>()
  const counted = new Set<string>()
  for (const event of recorded) {
    if (counted.has(event.eventId)) continue
    counted.add(event.eventId)
    const key = `${event.user}|${event.meter}|${event.periodStart ?? -1}`
    sums.set(key, (sums.get(key) ?? 0) + (event.amount ?? 0))
  }
  return {
    eventsOfChangesTheDatabaseLacks: recorded.filter((event) => !stored.has(changeOf(event))).length,
    acknowledgedWithoutEvent: [...acknowledged].filter((change) => !inStream.has(change)).length,
    idsTwice: [...ids.values()].filter((count) => count > 1).length,
    sumMismatches: [...new Set([...sums.keys(), ...used.keys()])].filter(
      (key) => (sums.get(key) ?? 0) !== (used.get(key) ?? 0)
    ).length
  }
}
