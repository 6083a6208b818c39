/**
 * Writes one group of store events in one transaction, with one statement per table and kind of
 * change, each taking its rows as arrays (`unnest`). Events are images of rows, applied in order: a
 * row that appears several times in the group is collapsed to its last image first, because one
 * `insert ... on conflict do update` may not touch the same row twice.
 */
import pg from "pg"
import type { HoldRecord, LedgerOperation, StoreEvent } from "../../domain/events.js"
import { fnv1a32OfString, partitionOf } from "../../domain/partition.js"
import type { BackendIdentity, Fence } from "../Fence.js"
import type { WriteTarget } from "../Store.js"
import { CommitNotReplicated, PartitionsFenced, WriteOutcomeUnknown } from "../Fence.js"
import { integerArrayLiteral, textArrayLiteral } from "./arrayLiteral.js"
import { toStoredTextOrNull } from "./storedText.js"
import { withCheckedOutClient } from "./checkedOutClient.js"

/** The domain's null period (a meter with period `none`) as stored; see migrations/0001_initial.sql. */
export const periodNoneSentinel = -1

export const storedPeriodStart = (periodStart: number | null): number => periodStart ?? periodNoneSentinel

/** A row and the partition of its user (carried from the write, never computed again per row). */
type InPartition<Row> = Row & { readonly partition: number }

/** What one group changes, per table, after collapsing repeated rows to their last image. */
export interface CollapsedGroup {
  readonly holds: ReadonlyArray<InPartition<{ readonly user: string; readonly hold: HoldRecord }>>
  readonly ledger: ReadonlyArray<Extract<StoreEvent, { kind: "ledger" }>>
  readonly usage: ReadonlyArray<InPartition<Extract<StoreEvent, { kind: "usage" }>>>
  readonly slotsSet: ReadonlyArray<
    InPartition<{
      readonly user: string
      readonly job: string
      readonly leaseExpiresAt: number
    }>
  >
  readonly slotsFreed: ReadonlyArray<{ readonly user: string; readonly job: string }>
  readonly plans: ReadonlyArray<{ readonly user: string; readonly plan: string }>
  readonly periodFloors: ReadonlyArray<{ readonly user: string; readonly at: number }>
  readonly limitsSet: ReadonlyArray<{ readonly user: string; readonly meter: string; readonly limit: number }>
  readonly limitsRemoved: ReadonlyArray<{ readonly user: string; readonly meter: string }>
}

/** A map key for (user, x) that no two different pairs share: the user's length comes first. */
const pairKey = (user: string, other: string): string => `${user.length}:${user}${other}`

/**
 * Collapses a group to its last image per row. Ledger rows are appended as they are: never collapsed.
 * A write with a target gives every row its partition; one without (tests of the store alone) has
 * each row's computed from its user.
 */
export const collapseWrites = (
  writes: ReadonlyArray<{
    readonly events: ReadonlyArray<StoreEvent>
    readonly target?: { readonly partition: number } | undefined
  }>,
  partitions: number
): CollapsedGroup => {
  const holds = new Map<string, InPartition<{ user: string; hold: HoldRecord }>>()
  const ledger: Array<Extract<StoreEvent, { kind: "ledger" }>> = []
  const usage = new Map<string, InPartition<Extract<StoreEvent, { kind: "usage" }>>>()
  const slots = new Map<
    string,
    Extract<StoreEvent, { kind: "slot" | "slot_freed" }> & { partition: number }
  >()
  const plans = new Map<string, { user: string; plan: string }>()
  const periodFloors = new Map<string, { user: string; at: number }>()
  const limits = new Map<string, Extract<StoreEvent, { kind: "limit" }>>()
  for (const { events, target } of writes) {
    const fixed = target?.partition
    for (const event of events) {
      const partition = (): number => fixed ?? partitionOf(event.user, partitions)
      switch (event.kind) {
        case "hold":
          holds.set(pairKey(event.user, event.hold.id), {
            user: event.user,
            hold: event.hold,
            partition: partition()
          })
          break
        case "ledger":
          ledger.push(event)
          break
        case "usage":
          usage.set(pairKey(event.user, `${event.meter}|${storedPeriodStart(event.periodStart)}`), {
            ...event,
            partition: partition()
          })
          break
        case "slot":
        case "slot_freed":
          slots.set(pairKey(event.user, event.job), { ...event, partition: partition() })
          break
        case "plan":
          plans.set(event.user, { user: event.user, plan: event.plan })
          break
        case "period_floor":
          if ((periodFloors.get(event.user)?.at ?? -Infinity) < event.at)
            periodFloors.set(event.user, { user: event.user, at: event.at })
          break
        case "limit":
          limits.set(pairKey(event.user, event.meter), event)
          break
        case "event":
          // Published from the partition's log (EventPublisher.ts): no table holds it.
          break
      }
    }
  }
  const slotEvents = [...slots.values()]
  const limitEvents = [...limits.values()]
  return {
    holds: [...holds.values()],
    ledger,
    usage: [...usage.values()],
    slotsSet: slotEvents.flatMap((event) => (event.kind === "slot" ? [event] : [])),
    slotsFreed: slotEvents.flatMap((event) => (event.kind === "slot_freed" ? [event] : [])),
    plans: [...plans.values()],
    periodFloors: [...periodFloors.values()],
    limitsSet: limitEvents.flatMap((event) =>
      event.limit === null ? [] : [{ user: event.user, meter: event.meter, limit: event.limit }]
    ),
    limitsRemoved: limitEvents.flatMap((event) => (event.limit === null ? [event] : []))
  }
}

/** collapseWrites of one write with no target (the bench's projection of a group). */
export const collapseEvents = (events: ReadonlyArray<StoreEvent>, partitions: number): CollapsedGroup =>
  collapseWrites([{ events, target: undefined }], partitions)

/** The statements of a group, for one schema; built once per store. */
const statementTexts = (schema: string) => ({
  // Fails with SQLSTATE QCF01 (detail: the lost partitions) unless every epoch is still ours; holds the
  // owner rows FOR SHARE until COMMIT so a claim waits for this transaction (migration 0003).
  assertFence: `select "${schema}".assert_partition_epochs($1::integer[], $2::bigint[], $3)`,
  upsertHolds: `
    insert into "${schema}".holds
      (user_id, id, meter, amount, consumed, state, expires_at, created_at, closed_at, partition)
    select * from unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::bigint[], $6::text[],
                         $7::bigint[], $8::bigint[], $9::bigint[], $10::integer[])
    on conflict (user_id, id) do update set
      meter = excluded.meter, amount = excluded.amount, consumed = excluded.consumed,
      state = excluded.state, expires_at = excluded.expires_at, created_at = excluded.created_at,
      closed_at = excluded.closed_at`,
  // A plain insert, every row: a key is applied once by the decisions, not refused here (migration 0012).
  appendLedger: `
    insert into "${schema}".usage_ledger
      (user_id, meter, period_start, operation, hold_id, key, requested, delta, at)
    select * from unnest($1::text[], $2::text[], $3::bigint[], $4::text[], $5::text[], $6::text[],
                         $7::bigint[], $8::bigint[], $9::bigint[])`,
  // Thresholds crossed travel as comma-separated text: unnest flattens an array of arrays.
  upsertUsage: `
    insert into "${schema}".usage_totals (user_id, meter, period_start, used, thresholds_crossed, partition)
    select user_id, meter, period_start, used, string_to_array(crossed, ',')::double precision[], partition
    from unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[], $5::text[], $6::integer[])
      as row (user_id, meter, period_start, used, crossed, partition)
    on conflict (user_id, meter, period_start) do update
      set used = excluded.used, thresholds_crossed = excluded.thresholds_crossed`,
  upsertSlots: `
    insert into "${schema}".slots (user_id, job, lease_expires_at, partition)
    select * from unnest($1::text[], $2::text[], $3::bigint[], $4::integer[])
    on conflict (user_id, job) do update set lease_expires_at = excluded.lease_expires_at`,
  deleteSlots: `
    delete from "${schema}".slots as slot
    using unnest($1::text[], $2::text[]) as freed(user_id, job)
    where slot.user_id = freed.user_id and slot.job = freed.job`,
  upsertPlans: `
    insert into "${schema}".user_plans (user_id, plan)
    select * from unnest($1::text[], $2::text[])
    on conflict (user_id) do update set plan = excluded.plan`,
  // Never lowered: a write of a process whose clock lags must not move a floor back.
  upsertPeriodFloors: `
    insert into "${schema}".period_floors (user_id, floor_at)
    select * from unnest($1::text[], $2::bigint[])
    on conflict (user_id) do update set floor_at = greatest(period_floors.floor_at, excluded.floor_at)`,
  upsertLimits: `
    insert into "${schema}".user_limits (user_id, meter, limit_value)
    select * from unnest($1::text[], $2::text[], $3::bigint[])
    on conflict (user_id, meter) do update set limit_value = excluded.limit_value`,
  deleteLimits: `
    delete from "${schema}".user_limits as user_limit
    using unnest($1::text[], $2::text[]) as removed(user_id, meter)
    where user_limit.user_id = removed.user_id and user_limit.meter = removed.meter`
})

type StatementKey = keyof ReturnType<typeof statementTexts>

/** A statement's text and the name it is prepared under on each connection. */
export interface NamedStatement {
  readonly name: string
  readonly text: string
}

export type WriteStatements = { readonly [key in StatementKey]: NamedStatement }

/**
 * Named, so each pooled connection parses and plans a statement once instead of once per group (the
 * server's CPU per commit is what bounds throughput). The schema's hash keeps the names of two stores
 * apart, should they ever share a pool.
 */
export const writeStatements = (schema: string): WriteStatements => {
  const texts = statementTexts(schema)
  const named = {} as Record<StatementKey, NamedStatement>
  for (const key of Object.keys(texts) as Array<StatementKey>) {
    named[key] = { name: statementName(key, schema), text: texts[key] }
  }
  return named
}

/** A prepared statement's name: what it does, and the schema's hash (Postgres names stop at 63 bytes). */
export const statementName = (key: string, schema: string): string =>
  `quota_${key}_${fnv1a32OfString(schema).toString(36)}`

/** The statement names each pool's connections may prepare, with their texts (see claimStatementNames). */
const statementsByPool = new WeakMap<pg.Pool, Map<string, string>>()

/**
 * Records that `statements` will be prepared on `pool`'s connections; returns a name already taken on
 * it for a different text (two stores on one pool whose schemas' hashes collide), else null. Such a
 * name must never reach a pipelined group: pg refuses the statement on the client without sending it,
 * and the rest of the group, COMMIT included, would still run. The store refuses to start instead.
 */
export const claimStatementNames = (
  pool: pg.Pool,
  statements: ReadonlyArray<NamedStatement>
): string | null => {
  const known = statementsByPool.get(pool) ?? new Map<string, string>()
  statementsByPool.set(pool, known)
  const clash = statements.find(({ name, text }) => (known.get(name) ?? text) !== text)
  if (clash !== undefined) return clash.name
  for (const { name, text } of statements) known.set(name, text)
  return null
}

/** One submission of a group: a partition actor's batch, and where it belongs (see StoreShape.write). */
export interface FencedWrite {
  readonly events: ReadonlyArray<StoreEvent>
  readonly target: WriteTarget | undefined
}

/**
 * The partitions a group writes, with the epochs its writes were decided under; throws, before anything
 * is sent, if one is not held now or held under another epoch (a write queued before the partition was
 * lost and claimed again: its memory is from before the claim). A write with a target is checked once;
 * one without (tests of the store alone) per event, under the epoch held now.
 */
export const fenceOf = (
  fence: Fence,
  writes: ReadonlyArray<FencedWrite>,
  partitions: number
): { partitions: Array<number>; epochs: Array<number> } => {
  const epochs = new Map<number, number>()
  const refused = new Set<number>()
  const check = (partition: number, epoch: number | undefined): void => {
    const held = fence.epochOf(partition)
    if (held === undefined || (epoch !== undefined && epoch !== held)) refused.add(partition)
    else epochs.set(partition, held)
  }
  for (const { events, target } of writes) {
    if (target !== undefined) check(target.partition, target.epoch)
    else for (const event of events) check(partitionOf(event.user, partitions), undefined)
  }
  if (refused.size > 0) throw new PartitionsFenced([...refused])
  return { partitions: [...epochs.keys()], epochs: [...epochs.values()] }
}

/** One statement of a group; `name` absent for BEGIN and COMMIT (simple protocol, nothing to plan). */
export interface GroupQuery {
  readonly name?: string
  readonly text: string
  readonly values: ReadonlyArray<unknown>
}

/** The statements (text and array parameters) that apply a collapsed group, skipping empty tables. */
export const groupQueries = (
  statements: WriteStatements,
  group: CollapsedGroup
): ReadonlyArray<GroupQuery> => {
  const queries: Array<GroupQuery> = []
  const add = (statement: NamedStatement, rowCount: number, values: ReadonlyArray<unknown>): void => {
    if (rowCount > 0) queries.push({ ...statement, values })
  }
  const { holds, ledger, usage, slotsSet, slotsFreed, plans, periodFloors, limitsSet, limitsRemoved } = group
  const text = <Row>(rows: ReadonlyArray<Row>, column: (row: Row) => string | null): string =>
    textArrayLiteral(rows.map(column))
  /** A column of users, hold ids, keys or jobs: stored as storedText.ts says (U+0000 escaped). */
  const identifiers = <Row>(rows: ReadonlyArray<Row>, column: (row: Row) => string | null): string =>
    textArrayLiteral(rows.map((row) => toStoredTextOrNull(column(row))))
  const integer = <Row>(rows: ReadonlyArray<Row>, column: (row: Row) => number | null): string =>
    integerArrayLiteral(rows.map(column))
  const partitionOfRow = (row: { readonly partition: number }) => row.partition
  add(statements.upsertHolds, holds.length, [
    identifiers(holds, (row) => row.user),
    identifiers(holds, (row) => row.hold.id),
    text(holds, (row) => row.hold.meter),
    integer(holds, (row) => row.hold.amount),
    integer(holds, (row) => row.hold.consumed),
    text(holds, (row) => row.hold.state),
    integer(holds, (row) => row.hold.expiresAt),
    integer(holds, (row) => row.hold.createdAt),
    integer(holds, (row) => row.hold.closedAt),
    integer(holds, partitionOfRow)
  ])
  add(statements.appendLedger, ledger.length, [
    identifiers(ledger, (row) => row.user),
    text(ledger, (row) => row.meter),
    integer(ledger, (row) => storedPeriodStart(row.periodStart)),
    text(ledger, (row): LedgerOperation => row.operation),
    identifiers(ledger, (row) => row.holdId),
    identifiers(ledger, (row) => row.key),
    integer(ledger, (row) => row.requested),
    integer(ledger, (row) => row.delta),
    integer(ledger, (row) => row.at)
  ])
  add(statements.upsertUsage, usage.length, [
    identifiers(usage, (row) => row.user),
    text(usage, (row) => row.meter),
    integer(usage, (row) => storedPeriodStart(row.periodStart)),
    integer(usage, (row) => row.used),
    text(usage, (row) => (row.thresholdsCrossed ?? []).join(",")),
    integer(usage, partitionOfRow)
  ])
  add(statements.upsertSlots, slotsSet.length, [
    identifiers(slotsSet, (row) => row.user),
    identifiers(slotsSet, (row) => row.job),
    integer(slotsSet, (row) => row.leaseExpiresAt),
    integer(slotsSet, partitionOfRow)
  ])
  add(statements.deleteSlots, slotsFreed.length, [
    identifiers(slotsFreed, (row) => row.user),
    identifiers(slotsFreed, (row) => row.job)
  ])
  add(statements.upsertPlans, plans.length, [
    identifiers(plans, (row) => row.user),
    text(plans, (row) => row.plan)
  ])
  add(statements.upsertPeriodFloors, periodFloors.length, [
    identifiers(periodFloors, (row) => row.user),
    integer(periodFloors, (row) => row.at)
  ])
  add(statements.upsertLimits, limitsSet.length, [
    identifiers(limitsSet, (row) => row.user),
    text(limitsSet, (row) => row.meter),
    integer(limitsSet, (row) => row.limit)
  ])
  add(statements.deleteLimits, limitsRemoved.length, [
    identifiers(limitsRemoved, (row) => row.user),
    text(limitsRemoved, (row) => row.meter)
  ])
  return queries
}

/**
 * The server routine that warns when a COMMIT's wait for the synchronous standby is cancelled (the
 * notice's `R` field: untranslated, unlike its message, under any lc_messages).
 */
export const syncRepWaitRoutine = "SyncRepWaitForLSN"

/** SQLSTATE of `assert_partition_epochs` (migration 0003): a write's partition epoch was superseded. */
const epochSupersededSqlState = "QCF01"

const lostPartitionsOf = (error: unknown): ReadonlyArray<number> | undefined => {
  const { code, detail } = error as { code?: unknown; detail?: unknown }
  if (code !== epochSupersededSqlState || typeof detail !== "string") return undefined
  return detail.split(",").map(Number)
}

/**
 * Applies a group of events to the tables in one transaction (the projection: a checkpoint, or a
 * test's seed), fenced with the epochs of its partitions when scaled out.
 */
export const writeGroup = async (
  pool: pg.Pool,
  statements: WriteStatements,
  writes: ReadonlyArray<FencedWrite>,
  partitions: number,
  fence?: Fence,
  pipelined = false,
  identify?: (client: pg.PoolClient) => Promise<BackendIdentity>
): Promise<void> => {
  const queries = groupQueries(statements, collapseWrites(writes, partitions))
  if (queries.length === 0) return
  await runFencedTransaction(
    pool,
    statements,
    queries,
    fenceOf,
    writes,
    partitions,
    fence,
    pipelined,
    identify
  )
}

/** The partitions and epochs a group's fence checks, or a throw before anything is sent. */
export type FenceOf = (
  fence: Fence,
  writes: ReadonlyArray<FencedWrite>,
  partitions: number
) => { partitions: Array<number>; epochs: Array<number> }

/**
 * Runs `queries` between BEGIN and COMMIT on one client, after the fence check of the partitions the
 * writes touch (when scaled out). With `pipelined` they are all sent at once and cost one round trip; a
 * failure anywhere aborts the transaction and COMMIT answers ROLLBACK, so the group is all or nothing
 * either way. `identify` names the connection's server process before anything is sent, so that a
 * COMMIT left without an answer can be made final (WriteOutcomeUnknown); without it (the embedded
 * database, one session) such a failure is thrown as it came.
 */
export const runFencedTransaction = async (
  pool: pg.Pool,
  statements: Pick<WriteStatements, "assertFence">,
  queries: ReadonlyArray<GroupQuery>,
  fenceWrites: FenceOf,
  writes: ReadonlyArray<FencedWrite>,
  partitions: number,
  fence?: Fence,
  pipelined = false,
  identify?: (client: pg.PoolClient) => Promise<BackendIdentity>
): Promise<void> => {
  const fenced = fence === undefined ? undefined : fenceWrites(fence, writes, partitions)
  const all: Array<GroupQuery> = [{ text: "begin", values: [] }]
  if (fence !== undefined && fenced !== undefined) {
    all.push({ ...statements.assertFence, values: [fenced.partitions, fenced.epochs, fence.owner] })
  }
  all.push(...queries, { text: "commit", values: [] })

  await withCheckedOutClient(pool, async (client) => {
    const backend = identify === undefined ? undefined : await identify(client)
    // A cancel of the COMMIT's wait for the synchronous standby answers COMMIT with only a warning.
    let unreplicated: string | undefined
    const onNotice = (notice: {
      readonly routine?: string | undefined
      readonly message?: string | undefined
    }): void => {
      if (notice.routine === syncRepWaitRoutine) unreplicated ??= notice.message ?? syncRepWaitRoutine
    }
    client.on("notice", onNotice)
    const settled = await (
      pipelined ? Promise.allSettled(submitCorked(client, all)) : sequentially(client, all)
    ).finally(() => client.off("notice", onNotice))
    const failure = settled.find((outcome) => outcome.status === "rejected")
    const commit = settled.length === all.length ? settled[settled.length - 1] : undefined
    if (failure !== undefined) {
      // COMMIT was sent (pipelined: with everything; one by one: reached) and neither its answer nor a
      // server error came back: only the server knows how the transaction ended, or will end.
      if (
        commit !== undefined &&
        commit.status === "rejected" &&
        !settled.some(
          (outcome) => outcome.status === "rejected" && outcome.reason instanceof pg.DatabaseError
        )
      ) {
        if (backend !== undefined) throw new WriteOutcomeUnknown(backend, failure.reason)
      }
      const lost = lostPartitionsOf(failure.reason)
      if (fence !== undefined && fenced !== undefined && lost !== undefined) {
        fence.superseded(
          fenced.partitions
            .map((partition, index) => ({ partition, epoch: fenced.epochs[index]! }))
            .filter(({ partition }) => lost.includes(partition))
        )
        throw new PartitionsFenced(lost)
      }
      throw failure.reason
    }
    // Postgres answers COMMIT of an aborted transaction with ROLLBACK instead of an error.
    if (commit?.status === "fulfilled" && commit.value.command !== "COMMIT") {
      throw new Error(`commit answered ${commit.value.command}`)
    }
    if (unreplicated !== undefined) throw new CommitNotReplicated(unreplicated)
  })
}

/**
 * Named only on the pipelined path (a real server, one session per connection). The embedded PGlite
 * is one session behind every socket and keeps a prepared statement after its connection is gone, so
 * a new connection's Parse of the same name would fail there ("already exists") for good.
 */
const queryConfig = (query: GroupQuery, named: boolean): pg.QueryConfig =>
  query.name === undefined || !named
    ? { text: query.text, values: [...query.values] }
    : { name: query.name, text: query.text, values: [...query.values] }

/**
 * Submits every statement of a pipelined group while the socket is corked, so the group leaves in one
 * write: pg corks and uncorks around each extended-protocol statement, and BEGIN/COMMIT are written
 * uncorked, which cost one syscall (and one wake-up of the server) per statement. Corking nests, so
 * nothing is sent before the last statement is queued. A pipelined client submits synchronously once
 * connected, which a checked-out pool client is.
 */
export const submitCorked = (
  client: pg.PoolClient,
  queries: ReadonlyArray<GroupQuery>
): Array<Promise<pg.QueryResult>> => {
  const stream = (
    client as unknown as { connection?: { stream?: { cork?: () => void; uncork?: () => void } } }
  ).connection?.stream
  stream?.cork?.()
  try {
    return queries.map((query) => client.query(queryConfig(query, true)))
  } finally {
    stream?.uncork?.()
  }
}

/** One statement after another, stopping at the first failure (what pipelining does in one trip). */
export const sequentially = async (
  client: pg.PoolClient,
  queries: ReadonlyArray<GroupQuery>
): Promise<Array<PromiseSettledResult<pg.QueryResult>>> => {
  const settled: Array<PromiseSettledResult<pg.QueryResult>> = []
  for (const query of queries) {
    try {
      settled.push({ status: "fulfilled", value: await client.query(queryConfig(query, false)) })
    } catch (reason) {
      settled.push({ status: "rejected", reason })
      break
    }
  }
  return settled
}
