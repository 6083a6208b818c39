/**
 * A pool client checked out for one transaction. On a throw it rolls back and rethrows; a client whose
 * connection died or whose rollback failed is destroyed rather than returned to the pool. A dying
 * connection also emits 'error' on a checked-out client besides failing its queries: heard here,
 * since an unheard 'error' event would crash the process.
 */
import type pg from "pg"

export const withCheckedOutClient = async <A>(
  pool: pg.Pool,
  body: (client: pg.PoolClient) => Promise<A>,
  /** Whether a throw of `body` says the connection must not be reused (destroyed, not returned). */
  unusableAfter: (cause: unknown) => boolean = () => false
): Promise<A> => {
  const client = await pool.connect()
  let broken: Error | undefined
  const onConnectionError = (error: Error) => {
    broken = error
  }
  client.on("error", onConnectionError)
  try {
    return await body(client)
  } catch (cause) {
    if (unusableAfter(cause)) broken ??= cause instanceof Error ? cause : new Error(String(cause))
    await client.query("rollback").catch((rollbackError: Error) => {
      broken = rollbackError
    })
    throw cause
  } finally {
    // A client given back broken is ended by the pool, and its dying connection may still emit 'error'
    // (a FATAL message with no query running, as at a postmaster's exit): it keeps the listener. Only
    // one returned for reuse loses it (the pool listens to its idle clients).
    if (broken === undefined) client.off("error", onConnectionError)
    client.release(broken)
  }
}
