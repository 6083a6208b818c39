/**
 * Partition ownership in Postgres: members' heartbeats and per-partition owner epochs. Leases are
 * judged by the database's clock, so processes' clocks may drift; safety does not rest on them
 * anyway: every write checks its epoch (writeEvents.ts `checkFence`).
 */
import type pg from "pg"
import { Effect } from "effect"
import type { StoreUnavailable } from "../Store.js"
import { storeUnavailable } from "./errors.js"

const databaseNowMs = "(extract(epoch from clock_timestamp()) * 1000)::bigint"

/**
 * The first key of every member's advisory lock (migration 0007): the lock is (this, lock_key), so a
 * lock of this kind cannot be mistaken for another application's two-key lock with another namespace.
 */
export const memberLockNamespace = 0x51_43_4f_52 // "QCOR"

/**
 * Whether `member` (a column) is known dead: its member lock, taken on this server, is held by no
 * session (migration 0010's `member_lock_lost`, which reads the members row and pg_locks as they are
 * when it runs: within a claim, when the claim reaches the row, not when the claimer's round began).
 */
const memberLockLost = (schema: string, member: string) =>
  `"${schema}".member_lock_lost(${member}, ${memberLockNamespace})`

/**
 * Whether a claim by $2 may take `row`: its own row (stepped down from after a member-lock loss, or
 * claimed without hearing the answer), or, unless $5 (own rows only), a row whose lease ran out or was
 * released, or one whose owner is known dead now. In that order: the death, a function call and a look
 * at pg_locks, is judged only for rows another member still holds a lease of.
 */
const claimable = (schema: string, row: string) => `
  case
    when ${row}.owner = $2 then true
    when $5::boolean then false
    when ${row}.lease_expires_at < ${databaseNowMs} then true
    else ${memberLockLost(schema, `${row}.owner`)}
  end`

export const ownershipStatements = (schema: string) => ({
  // $3 the member lock's key, $4 the server it was taken on (null: this one, as the heartbeat's).
  heartbeat: `
    insert into "${schema}".members (owner, heartbeat_at, leaving, lock_key, lock_server)
    values (
      $1, ${databaseNowMs}, $2, $3::integer,
      case when $3::integer is null then null else coalesce($4::text, "${schema}".member_lock_server()) end
    )
    on conflict (owner) do update
      set heartbeat_at = excluded.heartbeat_at, leaving = excluded.leaving, lock_key = excluded.lock_key,
        lock_server = excluded.lock_server`,
  // $1 the lease.
  liveMembers: `
    select member.owner from "${schema}".members as member
    where not member.leaving and member.heartbeat_at > ${databaseNowMs} - $1
      and not ${memberLockLost(schema, "member.owner")}
    order by member.owner`,
  // Dead members that still hold a partition's lease: a claim would take those at once. Finding one
  // wakes every member's round too (the released-partitions channel), not only the finder's: each
  // takes its share at once instead of at its own next check, up to memberDeathCheckIntervalMs later.
  deadOwners: `
    select holder.owner, pg_notify('${partitionsReleasedChannel(schema)}', 'dead') from (
      select distinct owner from "${schema}".partition_owners
      where lease_expires_at > ${databaseNowMs} and owner <> ''
    ) as holder
    where ${memberLockLost(schema, "holder.owner")}`,

  forgetMember: `delete from "${schema}".members where owner = $1`,
  // Postgres's clock, for measuring a process's offset from it (src/cluster/ClockOffset.ts).
  serverTime: `select extract(epoch from clock_timestamp()) * 1000 as now_ms`,
  // Takes partitions whose lease ran out (or were released), the claimer's own, and those of members
  // known dead (see claimable); each claim bumps the epoch, which fences every write of the previous
  // owner that has not committed yet. FOR UPDATE conflicts with the KEY SHARE a write holds on its owner
  // rows (migration 0004): a row with a write in flight is skipped this round (SKIP LOCKED) and claimed
  // once that write has committed or failed, so no write of the old epoch can land after the claim, and
  // a paused writer holds back only its own partitions.
  // A death is judged here, row by row, when the claim reaches the row: a row updated since the
  // statement began (its owner claimed it back) is locked in its new version and judged again (Postgres
  // re-checks the condition then), and member_lock_lost reads the member as it is at that moment. Before,
  // the claim took every row of the owners on a dead list read at the start of the round: a member that
  // had locked again, heartbeat and claimed its rows back meanwhile lost them while serving them.
  // $1 lists the wanted partitions in order of preference; at most $4 are taken (null: all): the
  // claimer's own rows first (stepped down from after a member-lock loss: taking another's instead would
  // leave its own to wait out their leases), then the preferred among the others. $5: its own rows only.
  // Only partitions without a row count towards `created`'s limit: counting rows held by others there
  // (the first $4 wanted, whoever held them) left a partition that never had a row claimed by nobody.
  claim: `
    with expired as (
      select partition from "${schema}".partition_owners as owner_row
      where partition = any($1::integer[]) and ${claimable(schema, "owner_row")}
      order by owner = $2 desc, array_position($1::integer[], partition)
      limit $4
      for update skip locked
    ), taken as (
      update "${schema}".partition_owners as owner_row
      set owner = $2, epoch = owner_row.epoch + 1, lease_expires_at = ${databaseNowMs} + $3
      from expired
      where owner_row.partition = expired.partition and ${claimable(schema, "owner_row")}
      returning owner_row.partition, owner_row.epoch
    ), created as (
      insert into "${schema}".partition_owners (partition, owner, epoch, lease_expires_at)
      select partition, $2, 1, ${databaseNowMs} + $3
      from unnest($1::integer[]) with ordinality as wanted (partition, preference)
      where not $5 and not exists (
        select 1 from "${schema}".partition_owners as owner_row where owner_row.partition = wanted.partition
      )
      order by preference
      limit greatest(0, coalesce($4, 2147483647) - (select count(*) from taken))
      on conflict (partition) do nothing
      returning partition, epoch
    )
    select partition, epoch::text as epoch from taken
    union all
    select partition, epoch::text as epoch from created`,
  // Gives each of the $1 partitions that has no row one (owner '', epoch 0, lease 0: free), so that
  // claims find every partition as a row (FOR UPDATE SKIP LOCKED then spreads concurrent claimers over
  // the free ones instead of two inserting the same), and returns the partitions no lease covers now.
  surveyPartitions: `
    with missing as (
      select wanted.partition from generate_series(0, $1 - 1) as wanted (partition)
      where not exists (
        select 1 from "${schema}".partition_owners as owner_row where owner_row.partition = wanted.partition
      )
    ), created as (
      insert into "${schema}".partition_owners (partition, owner, epoch, lease_expires_at)
      select partition, '', 0, 0 from missing
      on conflict (partition) do nothing
    )
    select partition from missing
    union all
    select partition from "${schema}".partition_owners
    where partition < $1 and lease_expires_at < ${databaseNowMs}`,
  renew: `
    update "${schema}".partition_owners as owner_row
    set lease_expires_at = ${databaseNowMs} + $4
    from unnest($2::integer[], $3::bigint[]) as held (partition, epoch)
    where owner_row.partition = held.partition and owner_row.epoch = held.epoch and owner_row.owner = $1
    returning owner_row.partition`,
  // Each release tells the members listening (their member-lock sessions) to run a round now: the
  // partition's new owner claims it at once instead of at its next round.
  release: `
    with released as (
      update "${schema}".partition_owners as owner_row
      set lease_expires_at = 0
      from unnest($2::integer[], $3::bigint[]) as held (partition, epoch)
      where owner_row.partition = held.partition and owner_row.epoch = held.epoch and owner_row.owner = $1
      returning owner_row.partition
    )
    select pg_notify('${partitionsReleasedChannel(schema)}', count(*)::text) from released having count(*) > 0`,
  // Every lease of this owner on partitions other than $2 (those it serves): what it stepped down from
  // and can no longer serve, or claimed without hearing the answer.
  releaseUnserved: `
    with released as (
      update "${schema}".partition_owners set lease_expires_at = 0
      where owner = $1 and lease_expires_at > 0 and not (partition = any($2::integer[]))
      returning partition
    )
    select pg_notify('${partitionsReleasedChannel(schema)}', count(*)::text) from released having count(*) > 0`,
  // Leaving: every lease of this owner, including one whose claim answer never reached it.
  releaseAll: `
    with released as (
      update "${schema}".partition_owners set lease_expires_at = 0
      where owner = $1 and lease_expires_at > 0
      returning partition
    )
    select pg_notify('${partitionsReleasedChannel(schema)}', count(*)::text) from released having count(*) > 0`
})

/** The NOTIFY channel of released partitions (see memberLock.ts, which listens on it). */
export const partitionsReleasedChannel = (schema: string): string => `${schema}_partitions_released`

export type OwnershipStatements = ReturnType<typeof ownershipStatements>

export interface OwnershipQueries {
  /**
   * `lockKey`: the key of this process's member lock (null: it holds none, liveness by lease only);
   * `lockServer`: the server it was taken on, as `member_lock_server()` names it (null: the server the
   * heartbeat reaches). A lock taken before a failover says nothing of the member on the new server.
   */
  readonly heartbeat: (
    owner: string,
    leaving: boolean,
    lockKey?: number | null,
    lockServer?: string | null
  ) => Effect.Effect<void, StoreUnavailable>
  /** Members with a heartbeat within the lease, not leaving and not known dead. */
  readonly liveMembers: (leaseMs: number) => Effect.Effect<ReadonlyArray<string>, StoreUnavailable>
  /** Members known dead (their lock is gone) that still hold a lease: their partitions may be claimed now. */
  readonly deadOwners: () => Effect.Effect<ReadonlyArray<string>, StoreUnavailable>
  readonly forgetMember: (owner: string) => Effect.Effect<void, StoreUnavailable>
  /**
   * Returns the partitions actually claimed, with their new epochs: the claimer's own rows, those whose
   * lease ran out or was released, and those of members known dead when the claim reaches their rows.
   */
  readonly claim: (
    owner: string,
    /** In order of preference: with `limit`, the first claimable ones are taken. */
    partitions: ReadonlyArray<number>,
    leaseMs: number,
    /** At most this many (absent: every claimable one). */
    limit?: number,
    /** Only rows that name the claimer already (absent: false). */
    ownRowsOnly?: boolean
  ) => Effect.Effect<ReadonlyMap<number, number>, StoreUnavailable>
  /**
   * Creates the row of each of the first `partitions` partitions that has none (free), and returns
   * those that no lease covers now (no row before, lease run out, released).
   */
  readonly surveyPartitions: (partitions: number) => Effect.Effect<ReadonlyArray<number>, StoreUnavailable>
  /** Returns the partitions still held (the rest were taken over). */
  readonly renew: (
    owner: string,
    held: ReadonlyMap<number, number>,
    leaseMs: number
  ) => Effect.Effect<ReadonlySet<number>, StoreUnavailable>
  readonly release: (
    owner: string,
    held: ReadonlyMap<number, number>
  ) => Effect.Effect<void, StoreUnavailable>
  /** Releases every lease the owner holds on partitions other than `served` (see releaseUnserved). */
  readonly releaseUnserved: (
    owner: string,
    served: ReadonlyArray<number>
  ) => Effect.Effect<void, StoreUnavailable>
  /** Releases every lease the owner holds (leaving). */
  readonly releaseAll: (owner: string) => Effect.Effect<void, StoreUnavailable>
  /** Postgres's clock now (ms since the epoch, with its fraction): the leases' clock. */
  readonly serverTimeMs: () => Effect.Effect<number, StoreUnavailable>
}

export const makeOwnershipQueries = (pool: pg.Pool, schema: string): OwnershipQueries => {
  const statements = ownershipStatements(schema)
  return {
    heartbeat: (owner, leaving, lockKey = null, lockServer = null) =>
      Effect.tryPromise({
        try: () =>
          pool.query(statements.heartbeat, [owner, leaving, lockKey, lockServer]).then(() => undefined),
        catch: storeUnavailable("heartbeat")
      }),
    liveMembers: (leaseMs) =>
      Effect.tryPromise({
        try: async () =>
          (await pool.query<{ owner: string }>(statements.liveMembers, [leaseMs])).rows.map(
            (row) => row.owner
          ),
        catch: storeUnavailable("list live members")
      }),
    deadOwners: () =>
      Effect.tryPromise({
        try: async () =>
          (await pool.query<{ owner: string }>(statements.deadOwners)).rows.map((row) => row.owner),
        catch: storeUnavailable("list dead owners")
      }),
    forgetMember: (owner) =>
      Effect.tryPromise({
        try: () => pool.query(statements.forgetMember, [owner]).then(() => undefined),
        catch: storeUnavailable("forget member")
      }),
    claim: (owner, partitions, leaseMs, limit, ownRowsOnly = false) =>
      Effect.tryPromise({
        try: async () => {
          if (partitions.length === 0 || limit === 0) return new Map<number, number>()
          const result = await pool.query<{ partition: number; epoch: string }>(statements.claim, [
            [...partitions],
            owner,
            leaseMs,
            limit ?? null,
            ownRowsOnly
          ])
          return new Map(result.rows.map((row) => [row.partition, Number(row.epoch)]))
        },
        catch: storeUnavailable("claim partitions")
      }),
    surveyPartitions: (partitions) =>
      Effect.tryPromise({
        try: async () =>
          (await pool.query<{ partition: number }>(statements.surveyPartitions, [partitions])).rows.map(
            (row) => row.partition
          ),
        catch: storeUnavailable("survey partitions")
      }),
    renew: (owner, held, leaseMs) =>
      Effect.tryPromise({
        try: async () => {
          if (held.size === 0) return new Set<number>()
          const result = await pool.query<{ partition: number }>(statements.renew, [
            owner,
            [...held.keys()],
            [...held.values()],
            leaseMs
          ])
          return new Set(result.rows.map((row) => row.partition))
        },
        catch: storeUnavailable("renew partition leases")
      }),
    release: (owner, held) =>
      Effect.tryPromise({
        try: async () => {
          if (held.size === 0) return
          await pool.query(statements.release, [owner, [...held.keys()], [...held.values()]])
        },
        catch: storeUnavailable("release partitions")
      }),
    releaseUnserved: (owner, served) =>
      Effect.tryPromise({
        try: async () => {
          await pool.query(statements.releaseUnserved, [owner, [...served]])
        },
        catch: storeUnavailable("release partitions no longer served")
      }),
    releaseAll: (owner) =>
      Effect.tryPromise({
        try: async () => {
          await pool.query(statements.releaseAll, [owner])
        },
        catch: storeUnavailable("release every partition")
      }),
    serverTimeMs: () =>
      Effect.tryPromise({
        try: async () =>
          Number((await pool.query<{ now_ms: string }>(statements.serverTime)).rows[0]!.now_ms),
        catch: storeUnavailable("read the server's clock")
      })
  }
}
