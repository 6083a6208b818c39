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
 * Members whose process is known dead: their advisory lock is held by no session. Trusted only once the
 * server has been up for $1 ms: a restart of Postgres ends every session, and live members need a moment
 * to take their locks again.
 */
const deadMemberCondition = (member: string) => `
  ${member}.lock_key is not null
  and extract(epoch from (clock_timestamp() - pg_postmaster_start_time())) * 1000 > $1
  and not exists (
    select 1 from pg_locks as lock
    where lock.locktype = 'advisory' and lock.granted and lock.objsubid = 2
      and lock.database = (select oid from pg_database where datname = current_database())
      and lock.classid = ${memberLockNamespace}::oid and lock.objid = ${member}.lock_key::oid
  )`

export const ownershipStatements = (schema: string) => ({
  heartbeat: `
    insert into "${schema}".members (owner, heartbeat_at, leaving, lock_key)
    values ($1, ${databaseNowMs}, $2, $3)
    on conflict (owner) do update
      set heartbeat_at = excluded.heartbeat_at, leaving = excluded.leaving, lock_key = excluded.lock_key`,
  // $1 the grace after a Postgres start, $2 the lease.
  liveMembers: `
    select member.owner from "${schema}".members as member
    where not member.leaving and member.heartbeat_at > ${databaseNowMs} - $2
      and not (${deadMemberCondition("member")})
    order by member.owner`,
  // Dead members that still hold a partition's lease: what a claim may take at once. $1 the grace.
  deadOwners: `
    select distinct member.owner from "${schema}".members as member
    join "${schema}".partition_owners as owner_row on owner_row.owner = member.owner
    where owner_row.lease_expires_at > ${databaseNowMs} and ${deadMemberCondition("member")}`,

  forgetMember: `delete from "${schema}".members where owner = $1`,
  // Postgres's clock, for measuring a process's offset from it (src/cluster/ClockOffset.ts).
  serverTime: `select extract(epoch from clock_timestamp()) * 1000 as now_ms`,
  // Takes partitions whose lease ran out (or were released); each claim bumps the epoch, which fences
  // every write of the previous owner that has not committed yet. FOR UPDATE conflicts with the KEY
  // SHARE a write holds on its owner rows (migration 0004): a row with a write in flight is skipped
  // this round (SKIP LOCKED) and claimed once that write has committed or failed, so no write of the
  // old epoch can land after the claim, and a paused writer holds back only its own partitions.
  // $1 lists the wanted partitions in order of preference; at most $5 are taken (null: all): the
  // claimer's own rows first (stepped down from after a member-lock loss: taking another's instead would
  // leave its own to wait out their leases), then the preferred among those whose lease ran out, then
  // among those without a row. Only partitions
  // without a row count towards `created`'s limit: counting rows held by others there (the first $5
  // wanted, whoever held them) left a partition that never had a row claimed by nobody, ever.
  claim: `
    with expired as (
      select partition from "${schema}".partition_owners
      where partition = any($1::integer[])
        and (lease_expires_at < ${databaseNowMs} or owner = any($4::text[]))
      order by owner = $2 desc, array_position($1::integer[], partition)
      limit $5
      for update skip locked
    ), taken as (
      update "${schema}".partition_owners as owner_row
      set owner = $2, epoch = owner_row.epoch + 1, lease_expires_at = ${databaseNowMs} + $3
      from expired
      where owner_row.partition = expired.partition
        and (owner_row.lease_expires_at < ${databaseNowMs} or owner_row.owner = any($4::text[]))
      returning owner_row.partition, owner_row.epoch
    ), created as (
      insert into "${schema}".partition_owners (partition, owner, epoch, lease_expires_at)
      select partition, $2, 1, ${databaseNowMs} + $3
      from unnest($1::integer[]) with ordinality as wanted (partition, preference)
      where not exists (
        select 1 from "${schema}".partition_owners as owner_row where owner_row.partition = wanted.partition
      )
      order by preference
      limit greatest(0, coalesce($5, 2147483647) - (select count(*) from taken))
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
  /** `lockKey`: the key of this process's advisory lock (null: it holds none, liveness by lease only). */
  readonly heartbeat: (
    owner: string,
    leaving: boolean,
    lockKey?: number | null
  ) => Effect.Effect<void, StoreUnavailable>
  /** Members with a heartbeat within the lease, not leaving and not known dead. */
  readonly liveMembers: (leaseMs: number) => Effect.Effect<ReadonlyArray<string>, StoreUnavailable>
  /** Members known dead (their lock is gone) that still hold a lease: their partitions may be claimed now. */
  readonly deadOwners: () => Effect.Effect<ReadonlyArray<string>, StoreUnavailable>
  readonly forgetMember: (owner: string) => Effect.Effect<void, StoreUnavailable>
  /**
   * Returns the partitions actually claimed, with their new epochs: those whose lease ran out, and
   * those of `deadOwners` whatever their lease.
   */
  readonly claim: (
    owner: string,
    /** In order of preference: with `limit`, the first claimable ones are taken. */
    partitions: ReadonlyArray<number>,
    leaseMs: number,
    deadOwners?: ReadonlyArray<string>,
    /** At most this many (absent: every claimable one). */
    limit?: number
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
  /** Releases every lease the owner holds (leaving). */
  readonly releaseAll: (owner: string) => Effect.Effect<void, StoreUnavailable>
  /** Postgres's clock now (ms since the epoch, with its fraction): the leases' clock. */
  readonly serverTimeMs: () => Effect.Effect<number, StoreUnavailable>
}

/**
 * How long after Postgres started a missing member lock means a dead process (Postgres's restart ends
 * every session: live members take their locks again within a round).
 */
export const memberLockGraceMsDefault = 5_000

export const makeOwnershipQueries = (
  pool: pg.Pool,
  schema: string,
  lockGraceMs: number = memberLockGraceMsDefault
): OwnershipQueries => {
  const statements = ownershipStatements(schema)
  return {
    heartbeat: (owner, leaving, lockKey = null) =>
      Effect.tryPromise({
        try: () => pool.query(statements.heartbeat, [owner, leaving, lockKey]).then(() => undefined),
        catch: storeUnavailable("heartbeat")
      }),
    liveMembers: (leaseMs) =>
      Effect.tryPromise({
        try: async () =>
          (await pool.query<{ owner: string }>(statements.liveMembers, [lockGraceMs, leaseMs])).rows.map(
            (row) => row.owner
          ),
        catch: storeUnavailable("list live members")
      }),
    deadOwners: () =>
      Effect.tryPromise({
        try: async () =>
          (await pool.query<{ owner: string }>(statements.deadOwners, [lockGraceMs])).rows.map(
            (row) => row.owner
          ),
        catch: storeUnavailable("list dead owners")
      }),
    forgetMember: (owner) =>
      Effect.tryPromise({
        try: () => pool.query(statements.forgetMember, [owner]).then(() => undefined),
        catch: storeUnavailable("forget member")
      }),
    claim: (owner, partitions, leaseMs, deadOwners = [], limit) =>
      Effect.tryPromise({
        try: async () => {
          if (partitions.length === 0 || limit === 0) return new Map<number, number>()
          const result = await pool.query<{ partition: number; epoch: string }>(statements.claim, [
            [...partitions],
            owner,
            leaseMs,
            [...deadOwners],
            limit ?? null
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
