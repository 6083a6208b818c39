/**
 * Commits whose outcome is unknown, made final before the store reads or writes again.
 *
 * A group's COMMIT that outlasts the query timeout (a lost synchronous replica, a storage stall), or
 * whose connection is lost after it was sent, may still commit on the server. The actors of that group
 * answer `unavailable` and load their users again; a load that read before the late commit landed
 * would leave memory behind the database, and the next whole-row write would overwrite what landed
 * (issue 19: 5 010 granted against 5 000). So every load and every write group first makes each such
 * transaction recorded before it final: it ends the server process that ran it (`pg_terminate_backend`)
 * and waits until that process is gone. A transaction still running is then rolled back; one already
 * committed (or committed locally while it waited for a replica) stays committed. Either way the next
 * read sees its final outcome.
 *
 * "Before it" is strict (issue 26): a settle already running covers only the doubts recorded when it
 * began, so a caller joins it and then, if a doubt recorded before the caller's own start is still
 * there, runs (or joins) the next one. A storage stall times writers out at staggered moments, so a
 * second doubt arriving while the first is being ended is the common case.
 *
 * A server process is known by its pid, the moment it started (`backend_start`) and the moment its
 * server started (`pg_postmaster_start_time()`), read once per connection: a bare pid can, after a
 * restart, belong to an unrelated session (another process's member lock). Only a process matching all
 * three is ended. A server that started since (restarted, or another one behind the same address)
 * holds whatever outcome it now holds: the doubt is settled.
 *
 * Ending a backend whose COMMIT waits for the synchronous standby makes that commit visible on the
 * primary at once, whether the standby has it or not (Postgres warns that it "might not have been
 * replicated"); so does a restart of the primary for one whose connection was lost (issue 34). An answer
 * may rest only on what the standby has too: a pass that settled a doubt ends with a replication
 * barrier (replication.ts, one commit that waits for the standby as synchronous_commit says; WAL is
 * ordered), and nothing reads before it returned. While the standby stalls the barrier times out, the
 * settle fails, and so do the loads and writes waiting on it. A read already running when a pass made
 * something visible is run again after the barrier (`readSettled`): the loads, the recalls, the usage
 * history and the events publisher's outbox read all go through it. Without a doubt nothing of this
 * runs: two integer comparisons per read.
 *
 * Another process sees such a commit only after claiming the partition, and cannot claim it first: the
 * doubtful transaction holds its partitions' owner rows FOR KEY SHARE (migration 0004) until it ends,
 * the claim's FOR UPDATE skips them until then, and the claim's own COMMIT, after the ended one in WAL,
 * waits for the standby before the claimer reads anything of the partition.
 *
 * Until that is done, loads and writes fail with the reason (callers answer `unavailable`) and the next
 * one tries again: a server that cannot be reached answers no reads anyway.
 */
import type pg from "pg"
import { storeOutcomeSettleWaitMs, storeSettledReadAttemptsMax } from "../../domain/limits.js"
import type { BackendIdentity } from "../Fence.js"
import { WriteOutcomeUnknown } from "../Fence.js"

export interface OutcomeDoubts {
  /** Records the server process of a commit whose outcome is unknown. */
  readonly add: (backend: BackendIdentity) => void
  /**
   * Records a commit that is final and visible on the primary, but not known to be on the synchronous
   * standby (its wait was cancelled: CommitNotReplicated): nothing is read before a barrier returned.
   */
  readonly unreplicated: () => void
  /** Whether some commit's outcome is still unknown, or one made final is not yet known replicated. */
  readonly pending: () => boolean
  /**
   * Resolves once every commit recorded before this call is final and, if a pass ended one, replicated
   * as synchronous_commit requires; rejects (keeping what is not yet settled) when that cannot be done.
   */
  readonly settle: () => Promise<void>
  /**
   * Runs `read` so that it sees nothing a settle made visible before the synchronous standby had it:
   * settles first when something is pending, and runs it again when a pass ended a backend meanwhile.
   */
  readonly readSettled: <A>(read: () => Promise<A>) => Promise<A>
}

/** A read run as `OutcomeDoubts.readSettled` runs it (the outbox and the usage history take one). */
export type SettledRead = OutcomeDoubts["readSettled"]

const settlePollMs = 20

/** A timestamp as integer microseconds, compared in SQL only (never through a JS number or Date). */
export const microseconds = (timestamp: string): string =>
  `(extract(epoch from ${timestamp}) * 1000000)::bigint`

const identitySql = `
  select pid, ${microseconds("backend_start")}::text as started_us,
         ${microseconds("pg_postmaster_start_time()")}::text as server_started_us
  from pg_stat_activity where pid = pg_backend_pid()`

/** What each pooled connection's server process is, read at its first write (see identifyBackend). */
const identities = new WeakMap<pg.ClientBase, BackendIdentity>()

/** Records `client`'s server process as read by the writable check on connect (writablePrimary.ts). */
export const rememberIdentity = (client: pg.ClientBase, identity: BackendIdentity): void => {
  identities.set(client, identity)
}

/** The connection's server process, as the doubts know it; one query the first time per connection. */
export const identifyBackend = async (client: pg.ClientBase): Promise<BackendIdentity> => {
  const known = identities.get(client)
  if (known !== undefined) return known
  const row = (
    await client.query<{ pid: number; started_us: string; server_started_us: string }>(identitySql)
  ).rows[0]
  if (row === undefined) throw new Error("pg_stat_activity does not list this connection's server process")
  const identity: BackendIdentity = {
    pid: row.pid,
    startedUs: row.started_us,
    serverStartedUs: row.server_started_us
  }
  identities.set(client, identity)
  return identity
}

// The doubts' server processes that are still there, matched on pid and start; $1 pids, $2 starts.
const matchingSql = `
  from unnest($1::integer[], $2::bigint[]) as doubt (pid, started_us)
  join pg_stat_activity as activity
    on activity.pid = doubt.pid and ${microseconds("activity.backend_start")} = doubt.started_us`
const terminateSql = `select pg_terminate_backend(activity.pid) ${matchingSql}`
const aliveSql = `select doubt.pid, doubt.started_us::text as started_us ${matchingSql}`
const serverStartedSql = `select ${microseconds("pg_postmaster_start_time()")}::text as started_us`

/**
 * `replicated` waits until every commit made so far is on the synchronous standbys (replication.ts
 * `waitUntilReplicated`); it throws WriteOutcomeUnknown when its own commit got no answer.
 */
export const makeOutcomeDoubts = (
  pool: pg.Pool,
  enabled: boolean,
  replicated: () => Promise<void>
): OutcomeDoubts => {
  /** By the order they were recorded in (a Map keeps insertion order). */
  const doubts = new Map<number, BackendIdentity>()
  let recorded = 0
  /** The pass running now; it covers the doubts recorded when it began. */
  let pass: Promise<void> | undefined
  /** Passes that may have made a commit visible that the standby lacks; a read spanning one reads again. */
  let exposures = 0
  /** Such a pass ran and no barrier has returned since: nothing may be read. */
  let barrierOwed = false
  const exposed = (): void => {
    exposures += 1
    barrierOwed = true
  }

  const add = (backend: BackendIdentity): void => {
    if (!enabled) return
    doubts.set(recorded, backend)
    recorded += 1
  }

  const matching = (backends: ReadonlyArray<BackendIdentity>) => [
    backends.map((backend) => backend.pid),
    backends.map((backend) => backend.startedUs)
  ]

  /** Ends every process of `covered` on this server and waits until all are gone; settled ones are dropped. */
  const endAll = async (covered: ReadonlyArray<readonly [number, BackendIdentity]>): Promise<void> => {
    const serverStartedUs = (await pool.query<{ started_us: string }>(serverStartedSql)).rows[0]!.started_us
    // Ran on a server that has started since (or on another one): nothing of it can still commit here,
    // but a restart's recovery made it visible whether the standby has it or not.
    for (const [order, backend] of covered)
      if (backend.serverStartedUs !== serverStartedUs) {
        doubts.delete(order)
        exposed()
      }
    let left = covered.filter(([order]) => doubts.has(order))
    if (left.length === 0) return
    // Before the first backend ends: a read that overlaps the ending reads again.
    exposed()
    // A process already gone is simply not matched: its transaction is final either way.
    await pool.query(terminateSql, matching(left.map(([, backend]) => backend)))
    const deadline = performance.now() + storeOutcomeSettleWaitMs
    for (;;) {
      const alive = new Set(
        (
          await pool.query<{ pid: number; started_us: string }>(
            aliveSql,
            matching(left.map(([, backend]) => backend))
          )
        ).rows.map((row) => `${row.pid}@${row.started_us}`)
      )
      for (const [order, backend] of left)
        if (!alive.has(`${backend.pid}@${backend.startedUs}`)) doubts.delete(order)
      left = left.filter(([order]) => doubts.has(order))
      if (left.length === 0) return
      if (performance.now() >= deadline)
        throw new Error(
          `the server process(es) ${left.map(([, backend]) => backend.pid).join(", ")} of a commit whose outcome is unknown did not end within ${storeOutcomeSettleWaitMs} ms`
        )
      await new Promise((resolve) => setTimeout(resolve, settlePollMs))
    }
  }

  /**
   * The barrier; a barrier left without an answer is a doubt itself (its backend waits on). It covers
   * what was exposed before it began: an exposure while it runs (a cancelled wait whose commit may come
   * after it in WAL) is left owed, for the next.
   */
  const replicate = async (): Promise<void> => {
    const covered = exposures
    try {
      await replicated()
      if (exposures === covered) barrierOwed = false
    } catch (cause) {
      if (cause instanceof WriteOutcomeUnknown) add(cause.backend)
      throw cause
    }
  }

  const runPass = async (covered: ReadonlyArray<readonly [number, BackendIdentity]>): Promise<void> => {
    if (covered.length > 0) await endAll(covered)
    if (barrierOwed) await replicate()
  }

  const startPass = (): Promise<void> =>
    (pass ??= runPass([...doubts]).finally(() => {
      pass = undefined
    }))

  /** The order of the oldest doubt not yet settled, or undefined. */
  const oldest = (): number | undefined => doubts.keys().next().value

  const pending = (): boolean => doubts.size > 0 || barrierOwed

  const settle = async (): Promise<void> => {
    const before = recorded
    // A pass that began before some of these doubts were recorded does not cover them: the next does.
    for (;;) {
      const first = oldest()
      if ((first === undefined || first >= before) && !barrierOwed) return
      await startPass()
    }
  }

  const readSettled = async <A>(read: () => Promise<A>): Promise<A> => {
    for (let attempt = 1; ; attempt += 1) {
      if (pending()) await settle()
      const seen = exposures
      const result = await read()
      if (exposures === seen && !barrierOwed) return result
      if (attempt === storeSettledReadAttemptsMax)
        throw new Error(
          `commits of unknown outcome were made final during each of ${attempt} reads: read nothing they may have shown before the standby had them`
        )
    }
  }

  const unreplicated = (): void => {
    if (enabled) exposed()
  }

  return { add, unreplicated, pending, settle, readSettled }
}
