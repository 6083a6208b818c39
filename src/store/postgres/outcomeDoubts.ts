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
 * Until that is done, loads and writes fail with the reason (callers answer `unavailable`) and the next
 * one tries again: a server that cannot be reached answers no reads anyway.
 */
import type pg from "pg"
import { storeOutcomeSettleWaitMs } from "../../domain/limits.js"
import type { BackendIdentity } from "../Fence.js"

export interface OutcomeDoubts {
  /** Records the server process of a commit whose outcome is unknown. */
  readonly add: (backend: BackendIdentity) => void
  /** Whether some commit's outcome is still unknown. */
  readonly pending: () => boolean
  /**
   * Resolves once every commit recorded before this call is final; rejects (keeping the doubts not yet
   * settled) when one cannot be made so.
   */
  readonly settle: () => Promise<void>
}

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

export const makeOutcomeDoubts = (pool: pg.Pool, enabled: boolean): OutcomeDoubts => {
  /** By the order they were recorded in (a Map keeps insertion order). */
  const doubts = new Map<number, BackendIdentity>()
  let recorded = 0
  /** The pass running now; it covers the doubts recorded when it began. */
  let pass: Promise<void> | undefined

  const matching = (backends: ReadonlyArray<BackendIdentity>) => [
    backends.map((backend) => backend.pid),
    backends.map((backend) => backend.startedUs)
  ]

  /** Ends every process of `covered` on this server and waits until all are gone; settled ones are dropped. */
  const endAll = async (covered: ReadonlyArray<readonly [number, BackendIdentity]>): Promise<void> => {
    const serverStartedUs = (await pool.query<{ started_us: string }>(serverStartedSql)).rows[0]!.started_us
    // Ran on a server that has started since (or on another one): nothing of it can still commit here.
    for (const [order, backend] of covered)
      if (backend.serverStartedUs !== serverStartedUs) doubts.delete(order)
    let left = covered.filter(([order]) => doubts.has(order))
    if (left.length === 0) return
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

  const startPass = (): Promise<void> =>
    (pass ??= endAll([...doubts]).finally(() => {
      pass = undefined
    }))

  /** The order of the oldest doubt not yet settled, or undefined. */
  const oldest = (): number | undefined => doubts.keys().next().value

  return {
    add: (backend) => {
      if (!enabled) return
      doubts.set(recorded, backend)
      recorded += 1
    },
    pending: () => doubts.size > 0,
    settle: async () => {
      const before = recorded
      // A pass that began before some of these doubts were recorded does not cover them: the next does.
      for (let first = oldest(); first !== undefined && first < before; first = oldest()) await startPass()
    }
  }
}
