/**
 * The zero-setup database: with no DATABASE_URL the coordinator runs PGlite (Postgres compiled to
 * WASM, in this process) on a data directory and serves it over the Postgres wire protocol on
 * 127.0.0.1, so the same `pg` code path runs against it. It returns data and logs nothing.
 *
 * PGlite is single-session: a second connection waits while another holds a transaction. The pool
 * over it must have exactly one connection (`poolMax`), or a transaction and a load on two
 * connections could wait on each other.
 */
import { mkdir } from "node:fs/promises"
import { resolve } from "node:path"
import { PGlite } from "@electric-sql/pglite"
import { PGLiteSocketServer } from "@electric-sql/pglite-socket"
import { Data, Effect } from "effect"
import type { Scope } from "effect"

/** Where the embedded database keeps its files when configuration names no directory. */
export const embeddedDataDirectoryDefault = ".data/pglite"

export interface EmbeddedPostgresOptions {
  /** Default `.data/pglite`, relative to the working directory. */
  readonly dataDirectory?: string
}

export interface EmbeddedPostgres {
  /** For `pg`: postgres://postgres@127.0.0.1:<port>/postgres */
  readonly connectionString: string
  readonly dataDirectory: string
  /** The pool's size: always 1, PGlite serves one session at a time. */
  readonly poolMax: 1
  /** Stops the server and closes the database; safe to call more than once. */
  readonly close: () => Promise<void>
}

export class EmbeddedPostgresFailed extends Data.TaggedError("EmbeddedPostgresFailed")<{
  readonly dataDirectory: string
  readonly reason: string
  readonly cause?: unknown
}> {}

const startServer = async (dataDirectory: string): Promise<EmbeddedPostgres> => {
  await mkdir(dataDirectory, { recursive: true })
  const db = await PGlite.create(dataDirectory)
  // Port 0: the OS picks a free port; the server records the one it got.
  const server = new PGLiteSocketServer({ db, host: "127.0.0.1", port: 0 })
  try {
    await server.start()
  } catch (cause) {
    await db.close()
    throw cause
  }
  let closing: Promise<void> | undefined
  const close = (): Promise<void> => {
    closing ??= server.stop().then(() => db.close())
    return closing
  }
  return {
    connectionString: `postgres://postgres@${server.getServerConn()}/postgres`,
    dataDirectory,
    poolMax: 1,
    close
  }
}

/** Starts PGlite on the data directory and serves it on a free port of 127.0.0.1. */
export const startEmbeddedPostgres = (
  options: EmbeddedPostgresOptions = {}
): Effect.Effect<EmbeddedPostgres, EmbeddedPostgresFailed> => {
  const dataDirectory = resolve(options.dataDirectory ?? embeddedDataDirectoryDefault)
  return Effect.tryPromise({
    try: () => startServer(dataDirectory),
    catch: (cause) =>
      new EmbeddedPostgresFailed({
        dataDirectory,
        reason: cause instanceof Error ? cause.message : String(cause),
        cause
      })
  })
}

/** The embedded database for the life of the scope. */
export const embeddedPostgres = (
  options: EmbeddedPostgresOptions = {}
): Effect.Effect<EmbeddedPostgres, EmbeddedPostgresFailed, Scope.Scope> =>
  Effect.acquireRelease(startEmbeddedPostgres(options), (embedded) => Effect.promise(() => embedded.close()))
