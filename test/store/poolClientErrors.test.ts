/**
 * A pooled client whose backend is ended (a settle's pg_terminate_backend, an administrator, a
 * restart) while it is checked out and its holder listens to nothing emits 'error' on itself; with no
 * listener that event crashed `serve` (the nemesis: twice in two runs of 300 s, a FATAL 57P01
 * "terminating connection due to administrator command" on a Client instance). The store's pools give
 * every client a listener of its own from the moment it is handed out.
 */
import { Effect } from "effect"
import pg from "pg"
import { describe, expect, it } from "vitest"
import { poolConfig, scopedPool } from "../../src/store/postgres/PostgresStore.js"
import { testDatabaseUrl } from "../support/database.js"

describe("a pooled client whose backend is ended while it is checked out", () => {
  it("does not crash the process, and is not given back for reuse", async () => {
    const unhandled: Array<unknown> = []
    const onUncaught = (error: unknown) => unhandled.push(error)
    process.on("uncaughtException", onUncaught)
    const admin = new pg.Client({ connectionString: testDatabaseUrl })
    await admin.connect()
    try {
      await Effect.runPromise(
        Effect.scoped(
          Effect.gen(function* () {
            const pool = yield* scopedPool(poolConfig(testDatabaseUrl, 2, true))
            const client = yield* Effect.promise(() => pool.connect())
            const pid = (yield* Effect.promise(() =>
              client.query<{ pid: number }>("select pg_backend_pid() as pid")
            )).rows[0]!.pid
            yield* Effect.promise(() => admin.query("select pg_terminate_backend($1)", [pid]))
            yield* Effect.promise(() => new Promise((resolve) => setTimeout(resolve, 200)))
            client.release(new Error("its backend was ended"))
            // The pool answers again from a fresh connection.
            const again = yield* Effect.promise(() => pool.query<{ one: number }>("select 1 as one"))
            expect(again.rows[0]!.one).toBe(1)
          })
        )
      )
    } finally {
      process.off("uncaughtException", onUncaught)
      await admin.end()
    }
    expect(unhandled).toEqual([])
  })
})
