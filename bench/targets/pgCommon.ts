/**
 * Shared by the Postgres targets: where they connect and how many connections they use. The bench
 * creates its own databases (`bench_<tag>` for the baselines and ceilings, `bench_quota_<tag>` for the
 * coordinator) and drops them at the end, so nothing it measures shares tables or backends with other
 * work on the server, and cpu.ts can tell its backends apart by database name.
 */
import pg from "pg"

/** A database to connect to for `create database` / `drop database`; the bench writes nothing there. */
export const serverUrl = process.env["BENCH_DATABASE_URL"] ?? "postgres://postgres@127.0.0.1:5432/test"

/**
 * Connections per Postgres baseline. Requests beyond it wait in the pool's queue, as they would in a
 * web tier's pool; 16 is well past the 2 cores' worth of useful parallelism and under the server's 100.
 */
export const baselinePoolSize = 16

export const makePool = (connectionString: string, max: number): pg.Pool => {
  const pool = new pg.Pool({ connectionString, max, idleTimeoutMillis: 0, connectionTimeoutMillis: 60_000 })
  // An idle client's error (server restart) must not crash the bench: the next query reports it.
  pool.on("error", () => {})
  return pool
}

/** The URL of `database` on the same server as serverUrl. */
export const databaseUrl = (database: string): string => {
  const url = new URL(serverUrl)
  url.pathname = `/${database}`
  return url.toString()
}

const databaseNamePattern = /^bench_[a-z0-9_]+$/

/** Creates a database named `bench_...` and returns a function that drops it (closing its sessions). */
export const createDatabase = async (database: string): Promise<() => Promise<void>> => {
  if (!databaseNamePattern.test(database))
    throw new Error(`bench database name must match ${databaseNamePattern}`)
  const admin = makePool(serverUrl, 1)
  try {
    await admin.query(`create database ${database}`)
  } finally {
    await admin.end()
  }
  return async () => {
    const dropper = makePool(serverUrl, 1)
    try {
      await dropper.query(`drop database if exists ${database} with (force)`)
    } finally {
      await dropper.end()
    }
  }
}
