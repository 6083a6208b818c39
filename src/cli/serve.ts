/**
 * `serve` and `migrate`: the coordinator's wiring from environment settings to running layers.
 * Store: Postgres at DATABASE_URL, or an embedded PGlite under QUOTA_DATA_DIR for development.
 */
import { join } from "node:path"
import { Context, Effect, Layer } from "effect"
import type { Scope } from "effect"
import type { CoordinatorShape } from "../actors/Coordinator.js"
import { Coordinator, coordinatorLayer } from "../actors/Coordinator.js"
import type { OwnershipOptions, OwnershipState } from "../cluster/PartitionOwnership.js"
import {
  leaveOwnership,
  makeOwnershipState,
  memberLockLost,
  memberLockRegained,
  runOwnership,
  transportChanged
} from "../cluster/PartitionOwnership.js"
import type { Fence } from "../store/Fence.js"
import { makeOwnershipQueries, partitionsReleasedChannel } from "../store/postgres/ownership.js"
import { loadConfig } from "../config/configFile.js"
import type { Settings } from "../config/settings.js"
import { describeConnection } from "../config/natsConnection.js"
import { readSettings } from "../config/settings.js"
import type { Config } from "../domain/config.js"
import type { StoreEvent } from "../domain/events.js"
import { startEmbeddedPostgres } from "../store/embedded.js"
import { migrate } from "../store/postgres/migrate.js"
import { poolConfig, postgresStoreLayer, scopedPool } from "../store/postgres/PostgresStore.js"
import { ensureSettings } from "../store/postgres/settings.js"
import { unownedLongerThan } from "../cluster/UnownedPartitions.js"
import { Store } from "../store/Store.js"
import type { StoreShape } from "../store/Store.js"
import type { MetricsRecorder } from "../ops/MetricsRecorder.js"
import { Metrics, noMetrics } from "../ops/MetricsRecorder.js"
import { startOperations } from "../ops/Operations.js"
import type { EventPublisher } from "../events/EventPublisher.js"
import { EventLog } from "../events/EventLog.js"
import { EventQueue } from "../events/EventQueue.js"
import { startEvents } from "../events/startEvents.js"
import type { Logger } from "../transport/log.js"
import { logExpiry, makeLogger } from "../transport/log.js"
import type { NatsServerShape } from "../transport/NatsServer.js"
import { NatsServer, natsServerLayer, natsServerOptions } from "../transport/NatsServer.js"
import { memberDeathCheckIntervalMs, natsLossGraceMs, ownershipPoolConnections } from "../domain/limits.js"
import { holdMemberLock } from "../store/postgres/memberLock.js"
import { servingLossGraceMs } from "../cluster/ServingAbility.js"
import type { GaugeSources } from "../ops/PrometheusMetrics.js"
import { watchReplication } from "./watchReplication.js"
import type { ClockOffsetState } from "../cluster/ClockOffset.js"
import { clockOffsetNowMs, clockWithinBound, makeClockOffsetState } from "../cluster/ClockOffset.js"

/** The clock's gauges: its offset from Postgres's now, and whether it is beyond the bound. */
const clockGauges = (clock: ClockOffsetState) => ({
  clockOffsetMs: () => clockOffsetNowMs(clock) ?? 0,
  clockBeyondMax: () => !clockWithinBound(clock)
})

export interface DatabaseTarget {
  readonly connectionString: string
  readonly poolMax: number | undefined
  readonly embedded: boolean
}

/** DATABASE_URL, or an embedded PGlite started for the life of the scope. */
export const databaseTarget = (settings: Settings, logger: Logger) =>
  Effect.gen(function* () {
    if (settings.databaseUrl !== undefined) {
      return {
        connectionString: settings.databaseUrl,
        poolMax: undefined,
        embedded: false
      } satisfies DatabaseTarget
    }
    const dataDirectory = join(settings.dataDir, "pglite")
    const embedded = yield* Effect.acquireRelease(startEmbeddedPostgres({ dataDirectory }), (database) =>
      Effect.promise(() => database.close())
    )
    logger.warn(
      { dataDirectory: embedded.dataDirectory },
      "DATABASE_URL is not set: using an embedded PGlite database, for development only (one session, no replication)"
    )
    return {
      connectionString: embedded.connectionString,
      poolMax: embedded.poolMax,
      embedded: true
    } satisfies DatabaseTarget
  })

export const storeLayerFor = (
  settings: Settings,
  config: Config,
  target: DatabaseTarget,
  fence?: Fence,
  metrics?: MetricsRecorder,
  eventQueue?: EventQueue,
  logger?: Logger
) =>
  postgresStoreLayer({
    ...(logger === undefined
      ? {}
      : {
          onStartWait: (attempt: number, reason: string) =>
            logger.warn({ attempt, reason }, "postgres cannot be reached yet: trying again")
        }),
    usageRetention: { meters: config.meters, periodsKept: settings.usagePeriodsKept },
    connectionString: target.connectionString,
    prefix: settings.prefix,
    partitions: settings.partitions,
    recordEvents: settings.events.enabled,
    queryTimeoutMs: settings.storeQueryTimeoutMs,
    ...(metrics === undefined ? {} : { metrics }),
    ...(eventQueue === undefined ? {} : { eventQueue }),
    ...(target.poolMax === undefined ? {} : { poolMax: target.poolMax }),
    // PGlite's single session is not known to take pipelined transactions; a real server does.
    pipelined: !target.embedded,
    ...(fence === undefined
      ? {}
      : { fence, idleInTransactionMs: Math.max(500, Math.floor(settings.partitionLeaseMs / 2)) })
  })

/** Logs what the actors persisted that no request answered: expiries. */
const logPersisted = (logger: Logger) => (events: ReadonlyArray<StoreEvent>) => {
  for (const event of events) {
    if (event.kind === "hold" && event.hold.state === "expired") {
      logExpiry(logger, { user: event.user, id: event.hold.id, meter: event.hold.meter })
    } else if (event.kind === "slot_freed" && event.reason === "expired") {
      logExpiry(logger, { user: event.user, job: event.job })
    }
  }
}

export const coordinatorLayerFor = (
  config: Config,
  logger: Logger,
  partitions: number,
  ownership: OwnershipState | undefined,
  eventQueue?: EventQueue
) =>
  coordinatorLayer({
    config,
    partitions,
    ...(eventQueue === undefined ? {} : { eventQueue }),
    ...(ownership === undefined
      ? {}
      : {
          ownedPartitions: () => [...ownership.epochs.keys()],
          servingEpoch: ownership.servingEpoch
        }),
    onError: (user, message, cause) => logger.error({ user, err: cause }, message),
    onClockStepBack: (latestMs, readMs) =>
      logger.warn(
        { latest: new Date(latestMs).toISOString(), read: new Date(readMs).toISOString() },
        "the wall clock stepped back: decisions keep the latest period of each meter (a period never goes back)"
      ),
    onPersisted: logPersisted(logger)
  })

export const loadSettingsAndConfig = (env: NodeJS.ProcessEnv) =>
  Effect.gen(function* () {
    const settings = yield* readSettings(env)
    const loaded = yield* loadConfig(settings.configPath, settings.fairness, settings.clockOffsetMaxMs)
    const config: Config = {
      ...loaded,
      usageRecordedEvents: settings.events.enabled && settings.events.usageRecorded
    }
    return { settings, config }
  })

/**
 * Everything `serve` runs, until the scope closes; the NATS server layer drains on close. With
 * `ownership` the process serves only the partitions it claims (scaling out); without, all of them.
 */
export const serveLayers = (
  settings: Settings,
  config: Config,
  logger: Logger,
  target: DatabaseTarget,
  ownership: OwnershipState | undefined,
  metrics: MetricsRecorder = noMetrics,
  eventQueue?: EventQueue
) => {
  const store: Layer.Layer<Store | EventLog, unknown> = storeLayerFor(
    settings,
    config,
    target,
    ownership?.fence,
    metrics,
    eventQueue,
    logger
  )
  const coordinator = coordinatorLayerFor(config, logger, settings.partitions, ownership, eventQueue).pipe(
    Layer.provideMerge(store),
    Layer.provide(Layer.succeed(Metrics, metrics))
  )
  const server = natsServerLayer({
    ...natsServerOptions(settings, logger),
    metrics,
    ...(ownership === undefined ? {} : { initialPartitions: [], queueGroup: "per-process" })
  })
  return server.pipe(Layer.provideMerge(coordinator))
}

/** Claims this process's share of partitions and keeps it, in the background of the scope. */
const startOwnership = (
  settings: Settings,
  target: DatabaseTarget,
  ownership: OwnershipState,
  server: NatsServerShape,
  coordinator: CoordinatorShape,
  store: StoreShape,
  publisher: EventPublisher | undefined,
  logger: Logger,
  metrics: { readonly setGaugeSources: (sources: Partial<GaugeSources>) => void } | undefined
) =>
  Effect.gen(function* () {
    // Bounded waits: a round must not hang behind a paused process's locks (claims also skip
    // locked rows) or a slow server, or this process's own leases would lapse meanwhile.
    const pool = yield* scopedPool(
      poolConfig(target.connectionString, ownershipPoolConnections, false, {
        lockTimeoutMs: Math.max(100, Math.floor(settings.partitionLeaseMs / 4)),
        queryTimeoutMs: Math.max(500, Math.floor(settings.partitionLeaseMs / 2))
      })
    )
    // What the deployment risks, logged now and on change; charted as quota_postgres_synchronous_standbys.
    const synchronousStandbys = yield* watchReplication(pool, logger)
    metrics?.setGaugeSources({ postgresSynchronousStandbys: synchronousStandbys })
    const runFork = Effect.runForkWith(yield* Effect.context<never>())
    // Set below, once the options exist; the lock is first taken before them.
    let onMemberLockLost = (_reason: string): void => {}
    ownership.memberLockHeld = false
    const memberLock = yield* holdMemberLock({
      connectionString: target.connectionString,
      schema: "quota",
      onLost: (reason) => {
        logger.warn(
          { owner: ownership.owner },
          `${reason}: answering for no partition and stepping down from all until it is held again`
        )
        onMemberLockLost(reason)
      },
      onLocked: () => {
        // Held again (the server is back, or a failover reached a new primary): claim now, not at the
        // next round up to a third of a lease away. The wake is a no-op before the loop has started.
        if (ownership.memberLockLosses > 0)
          logger.warn(
            { owner: ownership.owner },
            "the member lock is held again: claiming this process's share now"
          )
        memberLockRegained(ownership)
      },
      // A member released partitions: the round that may claim them runs now, not at its next turn.
      notifications: { channel: partitionsReleasedChannel("quota"), onNotified: () => ownership.wake() }
    })
    const options: OwnershipOptions = {
      state: ownership,
      queries: makeOwnershipQueries(pool, "quota"),
      lockKey: memberLock.key,
      lockServer: memberLock.server,
      checkStore: store.check ?? store.ping,
      onStoreChange: (failed) =>
        logger.warn(
          { owner: ownership.owner, ...(failed === undefined ? {} : { error: failed }) },
          failed === undefined
            ? "the store passes its checks again: claiming this process's share again"
            : `the store has failed its checks for ${servingLossGraceMs(settings.partitionLeaseMs)} ms: answering for no partition and giving every one up until it passes`
        ),
      deathCheckIntervalMs: memberDeathCheckIntervalMs,
      transportLossGraceMs: natsLossGraceMs,
      partitions: settings.partitions,
      leaseMs: settings.partitionLeaseMs,
      renewIntervalMs: Math.max(1, Math.floor(settings.partitionLeaseMs / 3)),
      serve: (partitions) =>
        Effect.andThen(server.servePartitions(partitions), publisher?.start(partitions) ?? Effect.void),
      stop: (partitions) =>
        Effect.andThen(
          publisher?.stop(partitions) ?? Effect.void,
          Effect.andThen(server.stopPartitions(partitions), coordinator.dropPartitions(partitions))
        ),
      log: (message, fields) => logger.info({ owner: ownership.owner, ...fields }, message),
      onClockChange: (beyond) =>
        logger.warn(
          { owner: ownership.owner, offsetMs: ownership.clock?.measuredOffsetMs },
          beyond === undefined
            ? "the clock is back within QUOTA_CLOCK_OFFSET_MAX_MS of Postgres's: claiming this process's share again"
            : `${beyond}: answering for no partition and giving every one up until it is back within`
        )
    }
    onMemberLockLost = (reason) => {
      // memberLockLost stops the answers at once; the step-down (subscriptions, actors) runs on.
      runFork(memberLockLost(options, reason))
      ownership.wake()
    }
    server.onConnectionChange((up) => {
      logger.warn(
        { owner: ownership.owner, connected: up },
        up
          ? "NATS is back: claiming this process's share again"
          : `NATS is unreachable: every partition is given up after ${natsLossGraceMs} ms unless it is back`
      )
      transportChanged(options, up)
    })
    if (!server.connected()) transportChanged(options, false)
    yield* Effect.forkScoped(runOwnership(options))
    return options
  })

/** Serves until `stopped` completes, then drains: stop taking messages, answer in-flight, flush, close. */
export const serve = (
  env: NodeJS.ProcessEnv,
  stopped: Effect.Effect<void>
): Effect.Effect<void, unknown, Scope.Scope> =>
  Effect.gen(function* () {
    const { settings, config } = yield* loadSettingsAndConfig(env)
    const logger = makeLogger(settings.logLevel)
    const operations =
      settings.httpAddress === undefined
        ? undefined
        : yield* startOperations(
            settings.httpAddress,
            config,
            (message, cause) => logger.error({ err: cause }, message),
            ({ dependency, down, detail }) =>
              down === undefined
                ? logger.info({ dependency }, `${dependency} answers`)
                : logger.warn({ dependency, reason: down, detail }, `${dependency} is down: not ready`)
          )
    if (operations !== undefined)
      logger.info(
        { address: operations.http.address },
        "operations http listening (/metrics, /healthz, /readyz)"
      )
    const target = yield* databaseTarget(settings, logger)
    // The embedded database is one process's by definition: it serves every partition, unfenced.
    const ownership = target.embedded
      ? undefined
      : makeOwnershipState(undefined, makeClockOffsetState(settings.clockOffsetMaxMs))
    const metrics = operations?.metrics.recorder ?? noMetrics
    // Events switched off: nothing is recorded, nothing waits to be published.
    const eventQueue = settings.events.enabled
      ? new EventQueue(settings.events.outboxPerPartitionMax)
      : undefined
    const context = yield* Layer.build(
      serveLayers(settings, config, logger, target, ownership, metrics, eventQueue)
    )
    const server = Context.get(context, NatsServer)
    const coordinator = Context.get(context, Coordinator)
    const publisher = yield* startEvents({
      settings: settings.events,
      prefix: settings.prefix,
      connection: server.connection,
      log: Context.get(context, EventLog),
      queue: eventQueue ?? new EventQueue(settings.events.outboxPerPartitionMax),
      servable: ownership?.servable ?? (() => true),
      opened: coordinator.whenOpened,
      metrics,
      logger
    })
    if (publisher !== undefined) eventQueue?.listen(publisher.wake)
    if (operations !== undefined) {
      const store = Context.get(context, Store)
      operations.readiness.watchNats(server.connected)
      const unowned = () =>
        ownership === undefined
          ? []
          : unownedLongerThan(ownership.unowned, settings.partitionLeaseMs, performance.now())
      operations.readiness.watchPartitions(unowned)
      yield* operations.readiness.watchPostgres(store.ping)
      operations.metrics.setGaugeSources({
        slotWaiters: coordinator.slotWaiters,
        actorsResident: coordinator.residentActors,
        partitionsOwned: () => ownership?.epochs.size ?? server.servedPartitions().length,
        partitionsUnowned: () => unowned().length,
        eventsPending: () => eventQueue?.total() ?? 0,
        ...(ownership?.clock === undefined ? {} : clockGauges(ownership.clock))
      })
      if (ownership?.clock !== undefined) {
        const clock = ownership.clock
        operations.readiness.watchClock(() => !clockWithinBound(clock))
      }
    }
    // The embedded database is served whole by this process; scaled out, the ownership round starts
    // each partition's publisher when it claims the partition.
    if (ownership === undefined) yield* publisher?.start(server.servedPartitions()) ?? Effect.void
    const owning =
      ownership === undefined
        ? undefined
        : yield* startOwnership(
            settings,
            target,
            ownership,
            server,
            coordinator,
            Context.get(context, Store),
            publisher,
            logger,
            operations?.metrics
          )
    logger.info(
      {
        prefix: settings.prefix,
        partitions: settings.partitions,
        nats: describeConnection(settings.nats),
        database: target.embedded ? "embedded" : "DATABASE_URL",
        serviceId: server.serviceId,
        owner: ownership?.owner ?? "all partitions (embedded database)"
      },
      "serving"
    )
    yield* Effect.raceFirst(
      stopped,
      Effect.flatMap(server.closed, (error) =>
        error === undefined
          ? Effect.void
          : Effect.fail(new Error(`NATS closed the connection: ${error.message}`))
      )
    )
    logger.info("stopping: draining requests in flight and flushing the store")
    if (owning !== undefined) yield* leaveOwnership(owning)
  })

/** `migrate`: apply the schema and record the deployment's settings, then exit. */
export const migrateOnly = (
  env: NodeJS.ProcessEnv
): Effect.Effect<{ applied: ReadonlyArray<number>; version: number }, unknown, Scope.Scope> =>
  Effect.gen(function* () {
    const { settings } = yield* loadSettingsAndConfig(env)
    const logger = makeLogger(settings.logLevel)
    const target = yield* databaseTarget(settings, logger)
    const pool = yield* scopedPool(poolConfig(target.connectionString, target.poolMax))
    const report = yield* migrate(pool, "quota")
    yield* ensureSettings(pool, "quota", { prefix: settings.prefix, partitions: settings.partitions })
    return report
  })
