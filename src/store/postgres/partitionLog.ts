/**
 * The partition log in Postgres (migration 0010): the request path's write is one appended row per
 * partition actor's batch; the tables are its checkpoint, written off the request path.
 *
 * - `appendGroup`: one transaction for a group commit of many partitions' batches: the epoch fence of
 *   their partitions, then one INSERT per row (a named statement: the bodies go as parameters, not
 *   escaped into an array literal), COMMIT.
 * - `checkpointPartition`: one transaction per partition: lock the partition's progress row (so two
 *   checkpoints of a partition never project the same rows, whoever runs them: its owner, a new owner
 *   bringing the tail in, a test checking the tables), project the rows after `checkpointed` up to
 *   `through` (those the owner holds in memory, the rest read back), move `checkpointed`, delete the
 *   rows both checkpointed and published. The projection is the rows' events collapsed to their last
 *   image per table row (writeEvents.ts): deterministic from the log, so it needs no fence.
 */
import { Effect } from "effect"
import pg from "pg"
import type { EventLogShape } from "../../events/EventLog.js"
import type { PublishedEvent, QueuedRow } from "../../events/EventQueue.js"
import type { StoreEvent } from "../../domain/events.js"
import { checkpointRowsPerTransactionMax } from "../../domain/limits.js"
import type { BackendIdentity, Fence } from "../Fence.js"
import { CommitNotReplicated, PartitionsFenced, WriteOutcomeUnknown } from "../Fence.js"
import type { WriteTarget } from "../Store.js"
import { withCheckedOutClient } from "./checkedOutClient.js"
import { storeUnavailable } from "./errors.js"
import type { FencedWrite, GroupQuery, WriteStatements } from "./writeEvents.js"
import {
  collapseWrites,
  groupQueries,
  runFencedTransaction,
  sequentially,
  statementName,
  submitCorked,
  syncRepWaitRoutine,
  writeStatements
} from "./writeEvents.js"

/** A batch the owner appended and holds in memory: its position and its events. */
export interface LogEntry {
  readonly position: number
  readonly events: ReadonlyArray<StoreEvent>
}

/** A write to the log: a partition actor's batch at its position. */
export interface LogAppend {
  readonly events: ReadonlyArray<StoreEvent>
  readonly target: WriteTarget
}

const logStatementTexts = (schema: string) => ({
  appendRow: `
    insert into "${schema}".partition_log (partition, position, token, events, body)
    values ($1, $2, $3, $4, $5)`,
  ensureProgress: `
    insert into "${schema}".partition_progress (partition) values ($1) on conflict (partition) do nothing`,
  // checkpointAll, beside owners that may have an append whose COMMIT waits (for the synchronous
  // standby) below one that committed: such appends hold the owner row FOR KEY SHARE (the fence) until
  // they end. The row is taken only when none runs (SKIP LOCKED: held, it would also make claims skip
  // the partition), and no append starts until this commits. `owned`: whether the row exists at all.
  lockOwner: `
    select exists (select 1 from "${schema}".partition_owners where partition = $1) as owned,
      exists (select 1 from "${schema}".partition_owners where partition = $1 for update skip locked)
        as locked`,
  // A checkpoint under an epoch: the owner row as it stands, held against a claim (which skips rows
  // held so) until this commits.
  ownerEpoch: `
    select owner, epoch::text as epoch from "${schema}".partition_owners where partition = $1 for key share`,
  lockProgress: `
    select checkpointed::text as checkpointed, published::text as published
    from "${schema}".partition_progress where partition = $1 for update`,
  // Where the (locked) progress row stands, the log's last position, and the rows after `checkpointed`
  // up to both that and $2 (null: no bound) that the caller does not hold ($3), oldest first: one
  // statement, so one snapshot (an append committing meanwhile is past `last`, and not read). Ordered
  // by the column, not the text it is selected as (an output name wins in ORDER BY).
  readTail: `
    with bounds as (
      select progress.checkpointed,
        (select coalesce(max(position), 0) from "${schema}".partition_log where partition = $1) as last
      from "${schema}".partition_progress as progress where progress.partition = $1
    )
    select bounds.checkpointed::text as checkpointed, bounds.last::text as last,
      tail.position::text as position, tail.body
    from bounds left join lateral (
      select log.position, log.body from "${schema}".partition_log as log
      where log.partition = $1 and log.position > bounds.checkpointed
        and log.position <= least(coalesce($2::bigint, bounds.last), bounds.last)
        and not (log.position = any($3::bigint[]))
      order by log.position limit $4
    ) as tail on true
    order by tail.position`,
  // Never backwards: a publisher's mark from before a hand-off may come late.
  setProgress: `
    update "${schema}".partition_progress
    set checkpointed = greatest(checkpointed, $2), published = greatest(published, coalesce($3, published))
    where partition = $1
    returning published::text as published`,
  // Rows both in the tables and wholly in the stream are done with.
  trim: `
    delete from "${schema}".partition_log as log
    using "${schema}".partition_progress as progress
    where log.partition = $1 and progress.partition = $1
      and log.position <= least(progress.checkpointed, progress.published)`,
  // A publisher's start: the rows with events after a position ($2; null: after the published mark).
  unpublished: `
    select log.position::text as position, log.token, log.body, progress.published::text as published
    from "${schema}".partition_progress as progress
    left join "${schema}".partition_log as log
      on log.partition = progress.partition and log.events > 0
        and log.position > coalesce($2::bigint, progress.published)
    where progress.partition = $1
    order by log.position limit $3`,
  // The events of a partition's rows after its published mark: what its publisher has yet to send.
  unpublishedEvents: `
    select coalesce(sum(log.events), 0)::text as waiting
    from "${schema}".partition_log as log
    join "${schema}".partition_progress as progress using (partition)
    where log.partition = $1 and log.position > progress.published`
})

type LogStatementKey = keyof ReturnType<typeof logStatementTexts>
export type LogStatements = {
  readonly [key in LogStatementKey]: { readonly name: string; readonly text: string }
}

export const logStatements = (schema: string): LogStatements => {
  const texts = logStatementTexts(schema)
  const named = {} as Record<LogStatementKey, { name: string; text: string }>
  for (const key of Object.keys(texts) as Array<LogStatementKey>)
    named[key] = { name: statementName(key, schema), text: texts[key] }
  return named
}

/** What a row's body holds: the batch's events in decision order. */
export const encodeBody = (events: ReadonlyArray<StoreEvent>): string => JSON.stringify(events)
export const decodeBody = (body: string): ReadonlyArray<StoreEvent> => JSON.parse(body) as Array<StoreEvent>

/** How many of a batch's events are published (kind `event`). */
export const publishedEventsIn = (events: ReadonlyArray<StoreEvent>): number => {
  let count = 0
  for (const event of events) if (event.kind === "event") count += 1
  return count
}

/** Every append of a group names its partition and epoch: the fence checks each once. */
const fenceOfAppends = (
  fence: Fence,
  writes: ReadonlyArray<FencedWrite>
): { partitions: Array<number>; epochs: Array<number> } => {
  const partitions: Array<number> = []
  const epochs: Array<number> = []
  const refused: Array<number> = []
  for (const { target } of writes) {
    if (target === undefined) throw new Error("bug: an append without its partition")
    const held = fence.epochOf(target.partition)
    if (held === undefined || held !== target.epoch) refused.push(target.partition)
    else {
      partitions.push(target.partition)
      epochs.push(target.epoch)
    }
  }
  if (refused.length > 0) throw new PartitionsFenced(refused)
  return { partitions, epochs }
}

/** Appends a group's rows in one transaction, fenced with each partition's epoch when scaled out. */
export const appendGroup = async (
  pool: pg.Pool,
  statements: LogStatements & Pick<WriteStatements, "assertFence">,
  appends: ReadonlyArray<LogAppend>,
  fence: Fence | undefined,
  pipelined: boolean,
  identify?: (client: pg.PoolClient) => Promise<BackendIdentity>
): Promise<void> => {
  const queries: Array<GroupQuery> = appends.map(({ events, target }) => ({
    ...statements.appendRow,
    values: [target.partition, target.position, target.token, publishedEventsIn(events), encodeBody(events)]
  }))
  const writes: ReadonlyArray<FencedWrite> = appends
  await runFencedTransaction(pool, statements, queries, fenceOfAppends, writes, 0, fence, pipelined, identify)
}

export interface CheckpointOutcome {
  /** Every row at or below it is in the tables. */
  readonly checkpointed: number
  /** The highest position the log holds now, at or above `checkpointed` (0: an empty log). */
  readonly last: number
  /** Rows it projected (from memory and read back). */
  readonly projected: number
}

/**
 * Projects a partition's rows after its checkpoint up to `through` (Infinity: every row, at most
 * checkpointRowsPerTransactionMax of them; the caller loops until none is left) into the tables, in one
 * transaction; `known` are rows the caller holds (its own appends, confirmed): only the others are read
 * back. `through` may name positions with no row (an append that failed): every append at or below it
 * must be final (committed or not) when this runs. `published`: every row at or below it is wholly in
 * the events stream (undefined: the caller does not know); rows both checkpointed and published are
 * deleted. When `pipelined`, the checks, locks and reads go in one round trip and the writes and COMMIT
 * in another; with nothing to project and no mark to move it rolls back (no commit to wait for). Returns
 * where the checkpoint stands. A COMMIT left without an answer throws WriteOutcomeUnknown (the store
 * settles it).
 */
/**
 * Who runs a checkpoint, as far as it matters to what it may write: an owner under its epoch (scaled
 * out: the partition's owner row must still name it, else nothing is written and PartitionsFenced is
 * thrown), a checker beside the owners (`checkpointAll`: waits for their running appends), or the one
 * process of an unfenced store.
 */
export type CheckpointCaller = { readonly owner: string; readonly epoch: number } | "besideOwners" | undefined

export const checkpointPartition = async (
  pool: pg.Pool,
  statements: LogStatements & WriteStatements,
  partition: number,
  known: ReadonlyArray<LogEntry>,
  through: number,
  published: number | undefined,
  pipelined: boolean,
  identify?: (client: pg.PoolClient) => Promise<BackendIdentity>,
  caller?: CheckpointCaller
): Promise<CheckpointOutcome> =>
  withCheckedOutClient(pool, async (client) => {
    const backend = identify === undefined ? undefined : await identify(client)
    // The transaction's head: what it checks and locks, the log's last position and the rows to read
    // back. In one round trip when pipelined (none needs an earlier one's answer in JS; a failure aborts
    // the rest): a partition's open after a failover is one checkpoint per partition, and each round
    // trip of it is slow then.
    const ownerCheck =
      caller === "besideOwners"
        ? { ...statements.lockOwner, values: [partition] }
        : caller === undefined
          ? undefined
          : { ...statements.ownerEpoch, values: [partition] }
    const head: Array<GroupQuery> = [
      { text: "begin", values: [] },
      ...(ownerCheck === undefined ? [] : [ownerCheck]),
      { ...statements.ensureProgress, values: [partition] },
      { ...statements.lockProgress, values: [partition] },
      {
        ...statements.readTail,
        values: [
          partition,
          Number.isFinite(through) ? through : null,
          known.map((entry) => entry.position),
          checkpointRowsPerTransactionMax
        ]
      }
    ]
    const headSettled = await (pipelined
      ? Promise.allSettled(submitCorked(client, head))
      : sequentially(client, head))
    const headFailure = headSettled.find((outcome) => outcome.status === "rejected")
    if (headFailure !== undefined) throw headFailure.reason
    const answers = headSettled.map((outcome) => (outcome as PromiseFulfilledResult<pg.QueryResult>).value)
    if (caller === "besideOwners") {
      const owner = answers[1]!.rows[0] as { owned: boolean; locked: boolean }
      if (owner.owned && !owner.locked) throw new AppendsRunning(partition)
    } else if (caller !== undefined) {
      // `through` may name positions of this owner's failed appends: a new owner hands them out again,
      // and a mark moved past one it is appending would pass over its row.
      const row = answers[1]!.rows[0] as { owner: string; epoch: string } | undefined
      if (row === undefined || row.owner !== caller.owner || Number(row.epoch) !== caller.epoch)
        throw new PartitionsFenced([partition])
    }
    const tail = answers[answers.length - 1]!.rows as Array<{
      checkpointed: string
      last: string
      position: string | null
      body: string | null
    }>
    const progress = answers[answers.length - 2]!.rows[0] as { checkpointed: string; published: string }
    const checkpointed = Number(tail[0]!.checkpointed)
    const last = Number(tail[0]!.last)
    const readBack = tail.filter(
      (row): row is { checkpointed: string; last: string; position: string; body: string } =>
        row.position !== null
    )
    const upTo = Number.isFinite(through) ? through : last
    const held = known.filter((entry) => entry.position > checkpointed && entry.position <= upTo)
    // Read back in pieces (a new owner's tail): this transaction goes no further than the last row it
    // read, held rows past it included (the rows between were not read).
    const readEverything = readBack.length < checkpointRowsPerTransactionMax
    const lastRead = Number(readBack[readBack.length - 1]?.position ?? upTo)
    const reached = readEverything ? upTo : lastRead
    const entries: Array<LogEntry> = [
      ...held.filter((entry) => entry.position <= reached),
      ...readBack.map((row) => ({ position: Number(row.position), events: decodeBody(row.body) }))
    ].sort((left, right) => left.position - right.position)
    // Every append at or below a finite `through` is final, so nothing can land there any more; with no
    // bound, the log as it stood when read.
    const newCheckpointed = Math.max(checkpointed, reached)
    // Never published past what is checkpointed: a position above it may be handed out again (an append
    // that failed, no row) and its next row is not this caller's to call published.
    const publishedMark = published === undefined ? undefined : Math.min(published, newCheckpointed)
    if (
      entries.length === 0 &&
      newCheckpointed === checkpointed &&
      (publishedMark === undefined || publishedMark <= Number(progress.published))
    ) {
      // Nothing to project and no mark to move (a partition's open with no tail): no commit to wait for.
      await client.query("rollback")
      return { checkpointed, last: Math.max(last, checkpointed), projected: 0 }
    }
    const writes: Array<GroupQuery> =
      entries.length === 0
        ? []
        : [
            ...groupQueries(
              statements,
              // Every row names its partition: no user's is computed.
              collapseWrites(
                entries.map((entry) => ({ events: entry.events, target: { partition } })),
                partition + 1
              )
            )
          ]
    writes.push({ ...statements.setProgress, values: [partition, newCheckpointed, publishedMark ?? null] })
    writes.push({ ...statements.trim, values: [partition] })
    writes.push({ text: "commit", values: [] })
    // A cancel of the COMMIT's wait for the synchronous standby answers COMMIT with only a warning.
    let unreplicated: string | undefined
    const onNotice = (notice: {
      readonly routine?: string | undefined
      readonly message?: string | undefined
    }) => {
      if (notice.routine === syncRepWaitRoutine) unreplicated ??= notice.message ?? syncRepWaitRoutine
    }
    client.on("notice", onNotice)
    const settled = await (
      pipelined ? Promise.allSettled(submitCorked(client, writes)) : sequentially(client, writes)
    ).finally(() => client.off("notice", onNotice))
    const failure = settled.find((outcome) => outcome.status === "rejected")
    const commit = settled.length === writes.length ? settled[settled.length - 1] : undefined
    if (failure !== undefined) {
      const serverRefused = settled.some(
        (outcome) => outcome.status === "rejected" && outcome.reason instanceof pg.DatabaseError
      )
      if (commit?.status === "rejected" && !serverRefused && backend !== undefined)
        throw new WriteOutcomeUnknown(backend, failure.reason)
      throw failure.reason
    }
    if (commit?.status === "fulfilled" && commit.value.command !== "COMMIT")
      throw new Error(`commit answered ${commit.value.command}`)
    if (unreplicated !== undefined) throw new CommitNotReplicated(unreplicated)
    return { checkpointed: newCheckpointed, last: Math.max(last, newCheckpointed), projected: entries.length }
  })

/**
 * Brings every partition's log into the tables: what a test reads the tables after, and what an
 * operator may run to have them whole (the owners' own checkpoints run meanwhile: the progress row
 * keeps the two from projecting a row twice).
 */
/** checkpointAll found an append of the partition running: it tries the partition again shortly. */
class AppendsRunning extends Error {
  constructor(readonly partition: number) {
    super(`an append of partition ${partition} is running`)
  }
}

/** How long checkpointAll waits for a partition's running appends to end, and how often it looks. */
const checkpointAllWaitMsMax = 30_000
const checkpointAllRetryMs = 20

export const checkpointAll = async (pool: pg.Pool, schema: string): Promise<number> => {
  const statements = { ...writeStatements(schema), ...logStatements(schema) }
  const pending = await pool.query<{ partition: number }>(
    `select distinct log.partition from "${schema}".partition_log as log
     left join "${schema}".partition_progress as progress using (partition)
     where log.position > coalesce(progress.checkpointed, 0)`
  )
  let projected = 0
  for (const { partition } of pending.rows) {
    const giveUpAt = Date.now() + checkpointAllWaitMsMax
    for (;;) {
      const outcome = await checkpointPartition(
        pool,
        statements,
        partition,
        [],
        Infinity,
        undefined,
        false,
        undefined,
        "besideOwners"
      ).catch(async (cause: unknown) => {
        if (!(cause instanceof AppendsRunning) || Date.now() > giveUpAt) throw cause
        await new Promise((resolve) => setTimeout(resolve, checkpointAllRetryMs))
        return undefined
      })
      if (outcome === undefined) continue
      projected += outcome.projected
      if (outcome.projected < checkpointRowsPerTransactionMax) break
    }
  }
  return projected
}

/** Runs at most `max` tasks at once; the rest wait their turn in order. */
export const makeTurns = (max: number) => {
  let running = 0
  const waiting: Array<() => void> = []
  return {
    run: async <A>(task: () => Promise<A>): Promise<A> => {
      while (running >= max) await new Promise<void>((resolve) => waiting.push(resolve))
      running += 1
      try {
        return await task()
      } finally {
        running -= 1
        waiting.shift()?.()
      }
    }
  }
}

/** The publisher's view of the log (src/events/EventLog.ts), read as loads are: after doubts settle. */
export const makeEventLog = (
  pool: pg.Pool,
  schema: string,
  createdAt: number,
  readSettled: <A>(read: () => Promise<A>) => Promise<A>
): EventLogShape => {
  const statements = logStatements(schema)
  return {
    databaseTag: createdAt.toString(36),
    unpublished: (partition, after, limit) =>
      Effect.tryPromise({
        try: async () => {
          await pool.query(statements.ensureProgress.text, [partition])
          const [result, waiting] = await readSettled(() =>
            Promise.all([
              pool.query<{ position: string | null; token: string; body: string; published: string }>(
                statements.unpublished.text,
                [partition, after ?? null, limit]
              ),
              after === undefined
                ? pool.query<{ waiting: string }>(statements.unpublishedEvents.text, [partition])
                : undefined
            ])
          )
          return {
            published: Number(result.rows[0]?.published ?? 0),
            waiting: Number(waiting?.rows[0]?.waiting ?? 0),
            rows: result.rows.flatMap((row): Array<QueuedRow> =>
              row.position === null
                ? []
                : [
                    {
                      position: Number(row.position),
                      token: row.token,
                      events: decodeBody(row.body).filter(
                        (event): event is PublishedEvent => event.kind === "event"
                      )
                    }
                  ]
            )
          }
        },
        catch: storeUnavailable(`read the unpublished log of partition ${partition}`)
      })
  }
}
