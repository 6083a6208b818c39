/**
 * The Store port over Postgres (`pg`). Concurrent loads share statements (LoadBatch); writes go
 * through GroupCommit writers, so concurrent actors share transactions. Every `pg` failure becomes
 * `StoreUnavailable` here, at the edge.
 */
import { Cause, Clock, Context, Effect, Exit, Layer, Option } from "effect"
import type { Scope } from "effect"
import pg from "pg"
import type { StoreEvent, StoredUser } from "../../domain/events.js"
import {
  idRetentionMs,
  loadRememberedIdsPerUserMax,
  storeConnectTimeoutMs,
  storeEventsPerCommitMax,
  checkpointRowsPerTransactionMax,
  checkpointsInFlightMax,
  storeLoadsInFlightMax,
  storeUsersPerLoadMax,
  storeWritersMax,
  storeQueryTimeoutMs,
  storeStartRetryMs,
  storeStartWaitMs
} from "../../domain/limits.js"
import type { Fence } from "../Fence.js"
import { CommitNotReplicated, PartitionsFenced, WriteOutcomeUnknown } from "../Fence.js"
import type { SettledRead } from "./outcomeDoubts.js"
import { identifyBackend, makeOutcomeDoubts } from "./outcomeDoubts.js"
import type { MetricsRecorder } from "../../ops/MetricsRecorder.js"
import type { EventQueue } from "../../events/EventQueue.js"
import { EventLog } from "../../events/EventLog.js"
import { partitionOf } from "../../domain/partition.js"
import { noMetrics } from "../../ops/MetricsRecorder.js"
import type { GroupCommitStats } from "../GroupCommit.js"
import { makeGroupCommit } from "../GroupCommit.js"
import type { StoreShape, WriteTarget } from "../Store.js"
import { Store, StoreUnavailable } from "../Store.js"
import type { InvalidSchemaName, SchemaTooNew, MigrationFilesInvalid, SettingsMismatch } from "./errors.js"
import { checkSchemaName, connectionFailedIn, storeUnavailable } from "./errors.js"
import type { LoadUserRow, RecallRow } from "./loadUser.js"
import { loadUsersSql, recallSql, recalledFromRow, storedUserFromRow } from "./loadUser.js"
import { fromStoredText, toStoredText } from "./storedText.js"
import { toSafeInteger, toSafeIntegerOrNull } from "./bigints.js"
import { makeUsageHistory } from "./usageHistory.js"
import type { UsageRetention } from "./usageRetention.js"
import { pruneUsagePeriods, usageRetentionIntervalMs } from "./usageRetention.js"
import { makeLoadBatch } from "../LoadBatch.js"
import { migrate } from "./migrate.js"
import { ensureSettings } from "./settings.js"
import {
  claimStatementNames,
  periodNoneSentinel,
  statementName,
  writeGroup,
  writeStatements
} from "./writeEvents.js"
import type { FencedWrite } from "./writeEvents.js"
import { pingWritable, refuseUnlessWritable } from "./writablePrimary.js"
import type { LogAppend, LogEntry } from "./partitionLog.js"
import type { CheckpointCaller } from "./partitionLog.js"
import { appendGroup, checkpointPartition, logStatements, makeEventLog, makeTurns } from "./partitionLog.js"
import { waitUntilReplicated } from "./replication.js"

/** The schema when configuration names none. */
export const defaultSchema = "quota"

export interface PostgresStoreOptions {
  readonly pool: pg.Pool
  /** Where the tables live (default `quota`); tests give each file its own. */
  readonly schema?: string
  /** The deployment's partition count: written into holds and slots. */
  readonly partitions: number
  /** Events per commit (default storeEventsPerCommitMax). */
  readonly eventsPerCommitMax?: number
  /** Scaled out: every write checks this process still owns its partitions (see Fence.ts). */
  readonly fence?: Fence
  /** Send each write group in one round trip; the pool's clients must have `pipeline: true`. */
  readonly pipelined?: boolean
  /** Groups committed at once (see storeWritersMax). */
  readonly writersMax?: number
  /** Told of every group commit's duration and of fenced writes (default: metrics off). */
  readonly metrics?: MetricsRecorder
  /**
   * The events waiting to be published as this process counts them: an append that would take a
   * partition past its cap is refused (`StoreUnavailable`) before it is sent, and each append's events
   * are counted. Absent: events are recorded without a cap (tests of the store alone).
   */
  readonly eventQueue?: EventQueue
  /** false: events are not recorded (QUOTA_EVENTS_ENABLED=false). Default true. */
  readonly recordEvents?: boolean
  /**
   * Make a commit of unknown outcome final before loading again (see OutcomeDoubts.ts). Default: as
   * `pipelined` (a real server). The embedded PGlite runs one session at a time, so a load there
   * cannot start before the transaction it follows has ended.
   */
  readonly settleUnknownOutcomes?: boolean
}

/**
 * Whether a group's failure is one submission's doing and says nothing of the others': a row that
 * violates a constraint (integrity class 23: a ledger key applied twice), or a partition fenced. The
 * group commit then writes its submissions one by one (GroupCommit's `isolate`).
 */
const failedBecauseOfOneSubmission = (error: StoreUnavailable): boolean =>
  error.cause instanceof PartitionsFenced ||
  (error.cause instanceof pg.DatabaseError && (error.cause.code ?? "").startsWith("23"))

const eventsIn = (writes: ReadonlyArray<FencedWrite>): number => {
  let count = 0
  for (const write of writes) count += write.events.length
  return count
}

/** Events a write records, per partition (empty for nearly every write). */
const eventsByPartition = (
  events: ReadonlyArray<StoreEvent>,
  target: WriteTarget | undefined,
  partitions: number
): Map<number, number> => {
  const counted = new Map<number, number>()
  for (const event of events) {
    if (event.kind !== "event") continue
    const partition = target?.partition ?? partitionOf(event.user, partitions)
    counted.set(partition, (counted.get(partition) ?? 0) + 1)
  }
  return counted
}

/** A (user, meter, period) whose running total differs from its ledger sum; reconcile wants none. */
export interface UsageMismatch {
  readonly user: string
  readonly meter: string
  readonly periodStart: number | null
  /** usage_totals.used, null when there is no row. */
  readonly totalUsed: number | null
  /** Sum of the ledger's deltas, null when there are no rows. */
  readonly ledgerSum: number | null
}

/** One meter of one user as the rows say: the latest period's used, and what pending holds reserve. */
export interface StoredMeterState {
  readonly user: string
  readonly meter: string
  readonly periodStart: number | null
  readonly used: number
  readonly reserved: number
  readonly pendingHolds: number
}

export interface PostgresStore extends StoreShape {
  /** Every (user, meter, period) where usage_totals differs from the ledger's sum. Empty when healthy. */
  readonly reconcile: () => Effect.Effect<ReadonlyArray<UsageMismatch>, StoreUnavailable>
  /** Per user and meter, computed in SQL from the rows: for tests that pair it with the actor's view. */
  readonly meterStates: () => Effect.Effect<ReadonlyArray<StoredMeterState>, StoreUnavailable>
  readonly commitStats: Effect.Effect<GroupCommitStats>
  /**
   * Runs a read of this store's database so that it sees only what the synchronous standby has too
   * (outcomeDoubts.ts): the events outbox is read through it.
   */
  readonly readSettled: SettledRead
}

const queryStatements = (schema: string) => ({
  loadUsers: loadUsersSql(schema),
  recall: recallSql(schema),
  usersWithExpiries: `
    select user_id from (
      select user_id from "${schema}".holds where state = 'pending' and expires_at <= $1
      union
      select user_id from "${schema}".slots where lease_expires_at <= $1
    ) as due
    limit $2`,
  usersWithExpiriesInPartitions: `
    select user_id from (
      select user_id from "${schema}".holds
      where state = 'pending' and partition = any($3::integer[]) and expires_at <= $1
      union
      select user_id from "${schema}".slots where partition = any($3::integer[]) and lease_expires_at <= $1
    ) as due
    limit $2`,
  reconcile: `
    with ledger as (
      select user_id, meter, period_start, sum(delta) as total
      from "${schema}".usage_ledger group by user_id, meter, period_start
    )
    select user_id, meter, nullif(period_start, ${periodNoneSentinel}) as period_start,
           totals.used::text as total_used, ledger.total::text as ledger_sum
    from "${schema}".usage_totals as totals
    full join ledger using (user_id, meter, period_start)
    where coalesce(totals.used, 0) <> coalesce(ledger.total, 0)
    order by user_id, meter, period_start`,
  meterStates: `
    with latest as (
      select distinct on (user_id, meter) user_id, meter, period_start, used
      from "${schema}".usage_totals order by user_id, meter, period_start desc
    ), pending as (
      select user_id, meter, sum(greatest(amount - consumed, 0)) as reserved, count(*) as holds
      from "${schema}".holds where state = 'pending' group by user_id, meter
    )
    select user_id, meter, nullif(latest.period_start, ${periodNoneSentinel}) as period_start,
           coalesce(latest.used, 0)::text as used, coalesce(pending.reserved, 0)::text as reserved,
           coalesce(pending.holds, 0)::integer as pending_holds
    from latest full join pending using (user_id, meter)
    order by user_id, meter`
})

/** Builds the store over an existing pool; the writer fiber lives in the caller's scope. */
export const makePostgresStore = (
  options: PostgresStoreOptions
): Effect.Effect<PostgresStore, InvalidSchemaName, Scope.Scope> =>
  Effect.gen(function* () {
    const { pool, partitions } = options
    const schema = options.schema ?? defaultSchema
    const invalidName = checkSchemaName(schema)
    if (invalidName !== null) return yield* invalidName
    const queries = queryStatements(schema)
    const statements = writeStatements(schema)
    const loadStatementName = statementName("loadUsers", schema)
    const clash = claimStatementNames(pool, [
      ...Object.values(statements),
      ...Object.values(logStatements(schema)),
      { name: loadStatementName, text: queries.loadUsers }
    ])
    if (clash !== null) {
      return yield* Effect.die(
        new Error(
          `prepared statement ${clash} is already used on this pool for another schema; give schema ${JSON.stringify(schema)} its own pool`
        )
      )
    }

    const metrics = options.metrics ?? noMetrics
    const settleUnknownOutcomes = options.settleUnknownOutcomes ?? options.pipelined ?? false
    const doubts = makeOutcomeDoubts(pool, settleUnknownOutcomes, () =>
      waitUntilReplicated(pool, schema, identifyBackend)
    )
    const pipelined = options.pipelined ?? false
    const identify = settleUnknownOutcomes ? identifyBackend : undefined
    const log = { ...statements, ...logStatements(schema) }
    const commitGroup = (writes: ReadonlyArray<FencedWrite>) =>
      Effect.tryPromise({
        try: async () => {
          // No group starts while a commit of unknown outcome recorded before it may still land: its rows
          // would be decided from memory that the late commit is about to contradict.
          if (doubts.pending()) await doubts.settle()
          // A partition actor's batches are appended to their partitions' logs; a write without a target
          // (a test's seed) is projected into the tables at once.
          if (writes[0]!.target !== undefined)
            await appendGroup(
              pool,
              log,
              writes as ReadonlyArray<LogAppend>,
              options.fence,
              pipelined,
              identify
            )
          else await writeGroup(pool, statements, writes, partitions, options.fence, pipelined, identify)
        },
        catch: (cause) => {
          if (cause instanceof PartitionsFenced) metrics.writeFenced()
          // Recorded before any waiter hears of the failure: the reloads it causes wait for the outcome.
          if (cause instanceof WriteOutcomeUnknown) doubts.add(cause.backend)
          if (cause instanceof CommitNotReplicated) doubts.unreplicated()
          return storeUnavailable(`commit ${eventsIn(writes)} events`)(cause)
        }
      })
    const instrumentedCommit =
      metrics === noMetrics
        ? commitGroup
        : (writes: ReadonlyArray<FencedWrite>) =>
            Effect.suspend(() => {
              const startedAt = performance.now()
              return Effect.onExit(commitGroup(writes), (exit) =>
                Effect.sync(() =>
                  metrics.storeCommitted((performance.now() - startedAt) / 1_000, Exit.isSuccess(exit))
                )
              )
            })
    const groupCommit = yield* makeGroupCommit<FencedWrite, StoreUnavailable>({
      commit: instrumentedCommit,
      itemsPerCommitMax: options.eventsPerCommitMax ?? storeEventsPerCommitMax,
      sizeOf: (write) => write.events.length,
      isolate: failedBecauseOfOneSubmission,
      writersMax: options.writersMax ?? storeWritersMax,
      closed: () => new StoreUnavailable({ reason: "the store is shutting down" })
    })

    // A test's seeds (writes with no target) commit as the appends do, in groups of their own.
    const seeds = yield* makeGroupCommit<FencedWrite, StoreUnavailable>({
      commit: instrumentedCommit,
      itemsPerCommitMax: options.eventsPerCommitMax ?? storeEventsPerCommitMax,
      sizeOf: (write) => write.events.length,
      isolate: failedBecauseOfOneSubmission,
      writersMax: options.writersMax ?? storeWritersMax,
      closed: () => new StoreUnavailable({ reason: "the store is shutting down" })
    })
    const commitStats = Effect.map(
      Effect.all([groupCommit.stats, seeds.stats]),
      ([appends, seeded]): GroupCommitStats => ({
        commits: appends.commits + seeded.commits,
        failedCommits: appends.failedCommits + seeded.failedCommits,
        submissions: appends.submissions + seeded.submissions,
        items: appends.items + seeded.items,
        largestCommitItems: Math.max(appends.largestCommitItems, seeded.largestCommitItems),
        queued: appends.queued + seeded.queued
      })
    )

    // Checkpoints (and opens) take turns: at most checkpointsInFlightMax hold a connection, so a cold
    // start opening every partition leaves the pool to loads and appends, and never times out waiting.
    const checkpointTurns = makeTurns(checkpointsInFlightMax)
    /** One checkpoint transaction of a partition; a COMMIT of unknown outcome is settled before anything reads. */
    const checkpointOnce = (
      partition: number,
      known: ReadonlyArray<LogEntry>,
      through: number,
      published: number | undefined,
      caller: CheckpointCaller
    ) =>
      Effect.tryPromise({
        try: () =>
          checkpointTurns.run(async () => {
            if (doubts.pending()) await doubts.settle()
            return await checkpointPartition(
              pool,
              log,
              partition,
              known,
              through,
              published,
              pipelined,
              identify,
              caller
            )
          }),
        catch: (cause) => {
          if (cause instanceof WriteOutcomeUnknown) doubts.add(cause.backend)
          if (cause instanceof CommitNotReplicated) doubts.unreplicated()
          return storeUnavailable(`checkpoint partition ${partition}`)(cause)
        }
      })

    const loads = makeLoadBatch<string, StoredUser>({
      query: async (users, now) => {
        // Named on a real server only: see queryConfig in writeEvents.ts for the embedded database.
        // Nothing is loaded that a settle made visible before the synchronous standby had it.
        const result = await doubts.readSettled(() =>
          pool.query<LoadUserRow & { user_id: string }>({
            ...(options.pipelined === true ? { name: loadStatementName } : {}),
            text: queries.loadUsers,
            values: [users.map(toStoredText), now - idRetentionMs, loadRememberedIdsPerUserMax + 1]
          })
        )
        return new Map(
          result.rows.map((row) => [
            fromStoredText(row.user_id),
            storedUserFromRow(row, loadRememberedIdsPerUserMax)
          ])
        )
      },
      keysPerQueryMax: storeUsersPerLoadMax,
      queriesInFlightMax: storeLoadsInFlightMax
    })

    const { eventQueue } = options
    const recordEvents = options.recordEvents ?? true
    /** One submission: a group never splits it, so the write is all or nothing (see GroupCommit). */
    // Appends and a test's seeds never share a group: the first write of a group says which it is.
    const submit = (events: ReadonlyArray<StoreEvent>, target: WriteTarget | undefined) =>
      events.length === 0
        ? Effect.void
        : target === undefined
          ? seeds.submit([{ events, target }])
          : groupCommit.submit([{ events, target }])
    const write = (
      events: ReadonlyArray<StoreEvent>,
      target?: WriteTarget
    ): Effect.Effect<void, StoreUnavailable> => {
      if (!recordEvents) {
        const kept = events.some((event) => event.kind === "event")
          ? events.filter((event) => event.kind !== "event")
          : events
        return submit(kept, target)
      }
      if (eventQueue === undefined) return submit(events, target)
      const recording = eventsByPartition(events, target, partitions)
      if (recording.size === 0) return submit(events, target)
      const full = eventQueue.overflowing(recording)
      if (full !== undefined)
        return Effect.fail(
          new StoreUnavailable({
            reason: `partition ${full} holds ${eventQueue.of(full)} events not yet published (QUOTA_EVENTS_OUTBOX_MAX ${eventQueue.perPartitionMax}): is JetStream taking events?`
          })
        )
      return Effect.tap(submit(events, target), () => Effect.sync(() => eventQueue.recorded(recording)))
    }

    // One check at a time: a stuck pool would otherwise gather one waiting check per interval.
    let checking: Promise<void> | undefined
    const checkOnce = (): Promise<void> =>
      (checking ??= (async () => {
        if (doubts.pending()) await doubts.settle()
        await pingWritable(pool)
      })().finally(() => {
        checking = undefined
      }))

    const usageHistory = makeUsageHistory(pool, schema, doubts.readSettled)
    const store: PostgresStore = {
      pastUsage: usageHistory.pastUsage,
      listUsage: usageHistory.listUsage,
      loadUsers: (users, now) =>
        Effect.tryPromise({
          // Each query of the batch load settles earlier doubts first (readSettled).
          try: async () => {
            const loaded = await Promise.all(users.map((user) => loads.load(user, now)))
            return new Map(users.map((user, index) => [user, loaded[index]!]))
          },
          catch: storeUnavailable(
            users.length === 1 ? `load user ${JSON.stringify(users[0])}` : `load ${users.length} users`
          )
        }),
      write,
      checkpoint: (partition, known, through, published, epoch) =>
        Effect.map(
          checkpointOnce(
            partition,
            known,
            through,
            published,
            options.fence === undefined ? undefined : { owner: options.fence.owner, epoch }
          ),
          ({ checkpointed }) => checkpointed
        ),
      openPartition: (partition) =>
        Effect.gen(function* () {
          // The tail a previous owner left, brought into the tables before anything of it is loaded.
          for (;;) {
            // Unbounded, as far as the log stands (no caller's epoch: it writes no mark past a row).
            const outcome = yield* checkpointOnce(partition, [], Infinity, undefined, undefined)
            if (outcome.projected < checkpointRowsPerTransactionMax)
              return { nextPosition: Math.max(outcome.last, outcome.checkpointed) + 1 }
          }
        }),
      recall: (user, ids, now) =>
        Effect.tryPromise({
          try: async () => {
            const result = await doubts.readSettled(() =>
              pool.query<RecallRow>(queries.recall, [
                toStoredText(user),
                ids.holds.map(toStoredText),
                ids.adjustments.map(toStoredText),
                now - idRetentionMs
              ])
            )
            return recalledFromRow(result.rows[0]!)
          },
          catch: storeUnavailable(`recall ids of user ${JSON.stringify(user)}`)
        }),
      usersWithExpiries: (now, limit, inPartitions) =>
        Effect.tryPromise({
          try: async () => {
            const result =
              inPartitions === undefined
                ? await pool.query<{ user_id: string }>(queries.usersWithExpiries, [now, limit])
                : await pool.query<{ user_id: string }>(queries.usersWithExpiriesInPartitions, [
                    now,
                    limit,
                    inPartitions
                  ])
            return result.rows.map((row) => fromStoredText(row.user_id))
          },
          catch: storeUnavailable("find users with expiries")
        }),
      ping: Effect.tryPromise({
        try: () => pingWritable(pool),
        catch: storeUnavailable("ping")
      }),
      check: Effect.tryPromise({
        try: checkOnce,
        catch: storeUnavailable("check the store as a load uses it")
      }),
      reconcile: () =>
        Effect.tryPromise({
          try: async () => {
            const result = await pool.query<{
              user_id: string
              meter: string
              period_start: string | null
              total_used: string | null
              ledger_sum: string | null
            }>(queries.reconcile)
            return result.rows.map((row): UsageMismatch => ({
              user: fromStoredText(row.user_id),
              meter: row.meter,
              periodStart: toSafeIntegerOrNull(row.period_start),
              totalUsed: toSafeIntegerOrNull(row.total_used),
              ledgerSum: toSafeIntegerOrNull(row.ledger_sum)
            }))
          },
          catch: storeUnavailable("reconcile usage totals")
        }),
      meterStates: () =>
        Effect.tryPromise({
          try: async () => {
            const result = await pool.query<{
              user_id: string
              meter: string
              period_start: string | null
              used: string
              reserved: string
              pending_holds: number
            }>(queries.meterStates)
            return result.rows.map((row): StoredMeterState => ({
              user: fromStoredText(row.user_id),
              meter: row.meter,
              periodStart: toSafeIntegerOrNull(row.period_start),
              used: toSafeInteger(row.used),
              reserved: toSafeInteger(row.reserved),
              pendingHolds: row.pending_holds
            }))
          },
          catch: storeUnavailable("read meter states")
        }),
      commitStats,
      readSettled: doubts.readSettled
    }
    return store
  })

export interface PostgresStoreLayerOptions {
  readonly connectionString: string
  readonly schema?: string
  /** The deployment's subject prefix, recorded with the data. */
  readonly prefix: string
  readonly partitions: number
  /** Connections in the pool; 1 for the embedded database (PGlite is single-session). */
  readonly poolMax?: number
  readonly eventsPerCommitMax?: number
  /** Scaled out: the fence every write checks (see Fence.ts). */
  readonly fence?: Fence
  /**
   * Pipeline each write group (one round trip). Default true; the embedded PGlite server is given
   * false, as its single session is not known to take pipelined transactions.
   */
  readonly pipelined?: boolean
  /**
   * Scaled out: a process paused inside a write holds its partitions' owner rows (KEY SHARE) until
   * Postgres ends its session; this bounds that, so a claim is not held back much past the lease.
   */
  readonly idleInTransactionMs?: number
  /** Client-side wait for a statement's answer (default storeQueryTimeoutMs); tests shorten it. */
  readonly queryTimeoutMs?: number
  /** Delete the usage of periods older than kept (revision 1.3); absent: keep every period. */
  readonly usageRetention?: UsageRetention
  readonly metrics?: MetricsRecorder
  readonly eventQueue?: EventQueue
  readonly recordEvents?: boolean
  /** Told of each attempt at start that found no server answering (the start waits, storeStartWaitMs). */
  readonly onStartWait?: (attempt: number, reason: string) => void
  /** How long the start waits while no server answers (storeStartWaitMs by default). */
  readonly startWaitMs?: number
}

/** What a store error says: its reason when it has one (a tagged error's message is empty). */
const describe = (error: Error): string => (error as { reason?: unknown }).reason?.toString() ?? error.message

export type PostgresStoreLayerError =
  StoreUnavailable | InvalidSchemaName | SchemaTooNew | MigrationFilesInvalid | SettingsMismatch

/** Connections of the pool to a real server when configuration names no other number. */
export const poolConnectionsDefault = 10

/** The pool's settings: bounded waits, so a dead server fails calls instead of hanging them. */
/** Server-side bounds of a pool's sessions, so a stalled or paused process cannot hold locks for long. */
export interface SessionBounds {
  /** Postgres ends a session left idle inside a transaction this long, releasing its locks. */
  readonly idleInTransactionMs?: number
  /** A statement waiting this long for a lock fails instead of waiting on. */
  readonly lockTimeoutMs?: number
  /** Client-side wait for a statement's answer (default storeQueryTimeoutMs). */
  readonly queryTimeoutMs?: number
}

export const poolConfig = (
  connectionString: string,
  poolMax: number = poolConnectionsDefault,
  pipeline = false,
  bounds: SessionBounds = {}
): pg.PoolConfig => ({
  connectionString,
  max: poolMax,
  pipeline,
  ...(bounds.idleInTransactionMs === undefined
    ? {}
    : { idle_in_transaction_session_timeout: bounds.idleInTransactionMs }),
  ...(bounds.lockTimeoutMs === undefined ? {} : { lock_timeout: bounds.lockTimeoutMs }),
  connectionTimeoutMillis: storeConnectTimeoutMs,
  // Never write to a standby: each new connection is checked once and refused unless writable.
  onConnect: refuseUnlessWritable,
  query_timeout: bounds.queryTimeoutMs ?? storeQueryTimeoutMs
})

/** A pool that lives as long as the scope. */
export const scopedPool = (config: pg.PoolConfig): Effect.Effect<pg.Pool, never, Scope.Scope> =>
  Effect.acquireRelease(
    Effect.sync(() => {
      const pool = new pg.Pool(config)
      // An idle client that loses its connection emits 'error' on the pool, which would crash the
      // process without a listener. The pool drops that client; the next query fails and is mapped.
      pool.on("error", () => {})
      // And every client keeps a listener of its own from the moment it is handed out: an 'error' event
      // between the pool's listeners and a caller's (a FATAL from a backend ended by a settle or an
      // administrator, a second one after the first was handled) crashed the process (the nemesis,
      // twice in two runs of 300 s). Its queries fail with the error either way, and a broken client is
      // not given back to the pool for reuse.
      pool.on("connect", (client) => client.on("error", () => {}))
      return pool
    }),
    (pool) => Effect.promise(() => pool.end())
  )

/**
 * The production wiring: a pool, the schema migrated, the settings checked, and the Store service.
 * The pool closes with the layer, after the writer finished its last group.
 */
export const postgresStoreLayer = (
  options: PostgresStoreLayerOptions
): Layer.Layer<Store | EventLog, PostgresStoreLayerError> =>
  Layer.effectContext(
    Effect.gen(function* () {
      const schema = options.schema ?? defaultSchema
      const pipelined = options.pipelined ?? true
      const pool = yield* scopedPool(
        poolConfig(options.connectionString, options.poolMax, pipelined, {
          ...(options.idleInTransactionMs === undefined
            ? {}
            : { idleInTransactionMs: options.idleInTransactionMs }),
          ...(options.queryTimeoutMs === undefined ? {} : { queryTimeoutMs: options.queryTimeoutMs })
        })
      )
      // A process started while its database cannot be reached (restarted during an outage, or before
      // Postgres) waits for it, as it waits for NATS, instead of exiting: no server answers is not a
      // refusal. Anything else (a refusal, a schema too new) ends the start at once.
      const waitUntil = performance.now() + (options.startWaitMs ?? storeStartWaitMs)
      for (let attempt = 1; ; attempt += 1) {
        const migrated = yield* Effect.exit(migrate(pool, schema))
        if (Exit.isSuccess(migrated)) break
        const error = Cause.findErrorOption(migrated.cause)
        const unreachable = Option.isSome(error) && connectionFailedIn(error.value)
        if (!unreachable || performance.now() >= waitUntil) return yield* Effect.failCause(migrated.cause)
        options.onStartWait?.(
          attempt,
          error.value instanceof Error ? describe(error.value) : String(error.value)
        )
        yield* Effect.sleep(storeStartRetryMs)
      }
      const stored = yield* ensureSettings(pool, schema, {
        prefix: options.prefix,
        partitions: options.partitions
      })
      const store = yield* makePostgresStore({
        pool,
        schema,
        partitions: options.partitions,
        ...(options.fence === undefined ? {} : { fence: options.fence }),
        ...(options.metrics === undefined ? {} : { metrics: options.metrics }),
        ...(options.eventQueue === undefined ? {} : { eventQueue: options.eventQueue }),
        ...(options.recordEvents === undefined ? {} : { recordEvents: options.recordEvents }),
        pipelined,
        ...(options.eventsPerCommitMax === undefined
          ? {}
          : { eventsPerCommitMax: options.eventsPerCommitMax })
      })
      const retention = options.usageRetention
      if (retention !== undefined) {
        // A failed sweep is tried again at the next interval; nothing waits for it.
        const sweep = Effect.flatMap(Clock.currentTimeMillis, (now) =>
          Effect.ignore(pruneUsagePeriods(pool, schema, retention, now))
        )
        yield* Effect.forkScoped(
          Effect.forever(Effect.andThen(sweep, Effect.sleep(usageRetentionIntervalMs)))
        )
      }
      return Context.make(Store, store as StoreShape).pipe(
        Context.add(EventLog, makeEventLog(pool, schema, stored.createdAt, store.readSettled))
      )
    })
  )
