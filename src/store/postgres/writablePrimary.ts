/**
 * Never write to a standby. After a failover the address in DATABASE_URL can still reach the old
 * primary, now a standby (in recovery), or a server set read-only. Every new pooled connection asks
 * once, before it is used (pg-pool's `onConnect` hook), whether its server takes writes; the same
 * query names the connection's server process for the outcome doubts (outcomeDoubts.ts), so the
 * check costs no extra round trip. A connection to a server that does not take writes is refused:
 * the pool ends it and the caller fails (the store answers `unavailable`); the next checkout connects
 * afresh, which through a moving address reaches the new primary. The readiness ping asks the same on
 * a pooled connection every second, so /readyz says why and a connection that went read-only is
 * destroyed rather than reused.
 */
import type pg from "pg"
import { withCheckedOutClient } from "./checkedOutClient.js"
import { microseconds, rememberIdentity } from "./outcomeDoubts.js"

/** What /readyz and the log say of a server that does not take writes (fixed words). */
export const notWritableReasons = {
  inRecovery: "connected to a standby (in recovery)",
  readOnly: "connected to a read-only server (transaction_read_only on)"
} as const

/** A connection refused because its server does not take writes; `reason` is one of notWritableReasons. */
export class ServerNotWritable extends Error {
  readonly reason: string
  constructor(reason: string) {
    super(`${reason}: refusing the connection until the address reaches a writable primary`)
    this.name = "ServerNotWritable"
    this.reason = reason
  }
}

/** The ServerNotWritable behind `cause` (itself, or a StoreUnavailable's cause), else undefined. */
export const serverNotWritableIn = (cause: unknown): ServerNotWritable | undefined => {
  if (cause instanceof ServerNotWritable) return cause
  const inner = typeof cause === "object" && cause !== null ? (cause as { cause?: unknown }).cause : undefined
  return inner instanceof ServerNotWritable ? inner : undefined
}

// One row whatever pg_stat_activity lists (the embedded server may list nothing): the identity is null then.
const checkSql = `
  select pg_is_in_recovery() as in_recovery,
         current_setting('transaction_read_only') = 'on' as read_only,
         activity.pid,
         ${microseconds("activity.backend_start")}::text as started_us,
         ${microseconds("pg_postmaster_start_time()")}::text as server_started_us
  from (select 1) as one
  left join pg_stat_activity as activity on activity.pid = pg_backend_pid()`

interface CheckRow {
  in_recovery: boolean
  read_only: boolean
  pid: number | null
  started_us: string | null
  server_started_us: string
}

/** Why `client`'s server does not take writes, or undefined when it does. One query. */
export const notWritableReason = async (client: pg.ClientBase): Promise<string | undefined> => {
  const row = (await client.query<CheckRow>(checkSql)).rows[0]
  if (row === undefined) throw new Error("the writable check returned no row")
  if (row.pid !== null && row.started_us !== null)
    rememberIdentity(client, {
      pid: row.pid,
      startedUs: row.started_us,
      serverStartedUs: row.server_started_us
    })
  if (row.in_recovery) return notWritableReasons.inRecovery
  if (row.read_only) return notWritableReasons.readOnly
  return undefined
}

/** pg-pool's `onConnect`: a connection to a server that does not take writes is refused (ended). */
export const refuseUnlessWritable = async (client: pg.ClientBase): Promise<void> => {
  const reason = await notWritableReason(client)
  if (reason !== undefined) throw new ServerNotWritable(reason)
}

/**
 * The readiness ping: asks on a pooled connection whether its server takes writes; a connection whose
 * server does not, or that failed, is destroyed (not returned to the pool) and the ping fails.
 */
export const pingWritable = (pool: pg.Pool): Promise<void> =>
  // Checked out as the store's writes are: a connection that dies meanwhile emits 'error' on the
  // checked-out client, which must be heard (unheard, it crashed the process under the nemesis).
  withCheckedOutClient(pool, refuseUnlessWritable, () => true)
