/**
 * The store port: where actors load users from and hand their decisions' events to. `write` succeeds
 * only once the events are durable; many actors' writes may share one commit (see GroupCommit.ts).
 */
import { Context, Data } from "effect"
import type { Effect } from "effect"
import type { PeriodUsage, RecalledIds, StoreEvent, StoredUser } from "../domain/events.js"

/** The store could not confirm: the write may or may not have happened. Callers answer `unavailable`. */
export class StoreUnavailable extends Data.TaggedError("StoreUnavailable")<{
  readonly reason: string
  readonly cause?: unknown
}> {}

export interface UsageListQuery {
  readonly partition: number
  readonly meter: string
  readonly periodStart: number | null
  readonly after: string | undefined
  readonly limit: number
}

export interface UsageListPage {
  readonly usage: ReadonlyArray<{ readonly user: string; readonly used: number }>
  /** More users follow the last one listed. */
  readonly more: boolean
}

/**
 * Where a write belongs: the partition whose actor decided it (every event is of a user of it), and the
 * epoch under which it loaded the memory it decided from. Read once from the subject and carried down.
 */
export interface WriteTarget {
  readonly partition: number
  readonly epoch: number
  /** The batch's place in its partition's log: the writer's next, never handed out twice by it. */
  readonly position: number
  /** The writer's claim token (drawn when it began to serve the partition): part of its events' ids. */
  readonly token: string
}

export interface StoreShape {
  /**
   * Every write is in the tables loads read as soon as it succeeds: there is no log to checkpoint (the
   * memory store). Absent: writes append to the partition's log, and `checkpoint` brings them in.
   */
  readonly writesCheckpointed?: boolean
  /**
   * Everything a partition actor needs of each of `users`, in as few round trips as the store's bounds
   * allow (a missing user is one with no rows: it loads empty). `now` bounds the retention window of
   * closed ids.
   */
  readonly loadUsers: (
    users: ReadonlyArray<string>,
    now: number
  ) => Effect.Effect<ReadonlyMap<string, StoredUser>, StoreUnavailable>
  /**
   * The closed holds and `adjust` ids among those named that the store remembers for `user` within the
   * retention window ending at `now`: what an actor whose memory holds only some of them (a capped
   * load, a cap) asks for before deciding a command that names one.
   */
  readonly recall: (
    user: string,
    ids: { readonly holds: ReadonlyArray<string>; readonly adjustments: ReadonlyArray<string> },
    now: number
  ) => Effect.Effect<RecalledIds, StoreUnavailable>
  /**
   * Makes `events` durable, applied in order. Succeeds only after the commit. `target` (a partition
   * actor's write): every event is of a user of `target.partition`, decided from memory loaded under
   * `target.epoch`; scaled out, the write is fenced with that epoch, not with the one held when its
   * group starts: a write queued before the partition was lost fails rather than land under a later
   * claim. Absent (tests of the store alone): each event's partition is computed, fenced with the
   * epochs held when the group starts.
   */
  readonly write: (
    events: ReadonlyArray<StoreEvent>,
    target?: WriteTarget
  ) => Effect.Effect<void, StoreUnavailable>
  /**
   * Brings the partition's log into the tables (the checkpoint) up to `through`: `known` are appends the
   * caller made and holds (only the rest are read back); every append at or below `through` must be
   * final. `published`: every row at or below it is wholly in the events stream (undefined: unknown);
   * rows both checkpointed and published are deleted. Returns the position every row at or below which
   * is now in the tables (a partition actor may let go of a user whose last change is at or below it).
   * `epoch`: the one the caller's log was opened under; scaled out, once the partition is claimed under
   * another the checkpoint writes nothing and fails (`through` may name positions of appends that
   * failed, which the new owner hands out again). Off the request path.
   */
  readonly checkpoint: (
    partition: number,
    known: ReadonlyArray<{ readonly position: number; readonly events: ReadonlyArray<StoreEvent> }>,
    through: number,
    published: number | undefined,
    epoch: number
  ) => Effect.Effect<number, StoreUnavailable>
  /**
   * Before a partition actor serves a partition: what earlier owners appended and did not checkpoint
   * is brought into the tables (so loads see every acknowledged change), and the position its first
   * append takes is returned.
   */
  readonly openPartition: (
    partition: number
  ) => Effect.Effect<{ readonly nextPosition: number }, StoreUnavailable>
  /**
   * Users with a pending hold or a slot lease due at or before `now`, at most `limit` of them (the
   * orphan sweep); only of `partitions` when given (a process sweeps the partitions it owns).
   */
  readonly usersWithExpiries: (
    now: number,
    limit: number,
    partitions?: ReadonlyArray<number>
  ) => Effect.Effect<ReadonlyArray<string>, StoreUnavailable>
  /**
   * Revision 1.3 `usage_history`: the user's usage rows of `meters` with `used` above 0, newest period
   * first, at most `periodsMax` per meter (the current period's among them, if stored).
   */
  readonly pastUsage: (
    user: string,
    meters: ReadonlyArray<string>,
    periodsMax: number
  ) => Effect.Effect<ReadonlyArray<PeriodUsage>, StoreUnavailable>
  /**
   * Revision 1.3 `list_usage`: the users of `partition` whose `used` of (meter, periodStart) is above 0,
   * in the UTF-8 byte order of their ids, after `after` (absent: from the first), at most `limit`.
   */
  readonly listUsage: (query: UsageListQuery) => Effect.Effect<UsageListPage, StoreUnavailable>
  /** One trivial round trip to the database (readiness): fails when it does not answer. */
  readonly ping: Effect.Effect<void, StoreUnavailable>
  /**
   * What a load goes through before it reads (commits of unknown outcome settled), then `ping`: fails
   * while loads and writes would (src/cluster/ServingAbility.ts gives the partitions up past a grace).
   * One at a time: a call while one runs joins it. Absent: `ping` says as much.
   */
  readonly check?: Effect.Effect<void, StoreUnavailable>
}

export class Store extends Context.Service<Store, StoreShape>()("quota-coordinator/Store") {}
