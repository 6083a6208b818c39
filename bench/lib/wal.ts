/**
 * WAL written during a measured window: the server's WAL position before and after
 * (`pg_current_wal_lsn`). Cluster-wide: every database's writes count, other jobs' on a shared server
 * included, and the reads of the position itself write nothing.
 */
import type pg from "pg"

export interface WalMeter {
  /** Reads the position now; the function it returns reads it again and gives the bytes between. */
  readonly start: () => Promise<() => Promise<number>>
}

export const makeWalMeter = (pool: pg.Pool): WalMeter => {
  const position = async (): Promise<string> =>
    (await pool.query<{ lsn: string }>("select pg_current_wal_lsn()::text as lsn")).rows[0]!.lsn
  return {
    start: async () => {
      const before = await position()
      return async () => {
        const row = (
          await pool.query<{ bytes: string }>(
            "select pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::text as bytes",
            [before]
          )
        ).rows[0]
        return Number(row!.bytes)
      }
    }
  }
}
