/**
 * Two commits of unknown outcome close together (issue 26, item 1). A storage stall times writers out
 * at staggered moments: user u1's group G1 gets no answer to its COMMIT (backend D1), and u1's reload
 * starts making D1 final; a moment later u2's group G2 times out the same way (D2). u2's reload must
 * not load while D2 may still commit: a settle that started before D2 was recorded does not cover it.
 *
 * Made deterministic, with no sleeps: each group's COMMIT waits (a deferred trigger, once per user) for
 * an advisory lock the test holds, past the 1 s query timeout; the first `pg_terminate_backend` the
 * store sends (the settle for D1) is held until both groups have been answered `unavailable`, so u2's
 * reload always finds that settle running; the lock is let go (D2 commits if it is still there) once
 * u2's load was answered or D2 is gone, whichever comes first.
 */
import { Context, Effect, Layer } from "effect"
import type pg from "pg"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import type { CoordinatorShape } from "../../src/actors/Coordinator.js"
import { Coordinator, coordinatorLayer } from "../../src/actors/Coordinator.js"
import type { Command } from "../../src/domain/commands.js"
import { defaultConfig } from "../../src/domain/config.js"
import type { Result } from "../../src/domain/results.js"
import { checkpointAll } from "../../src/store/postgres/partitionLog.js"
import { makePostgresStore } from "../../src/store/postgres/PostgresStore.js"
import { Store } from "../../src/store/Store.js"
import type { TestSchema } from "../support/database.js"
import { commitCommand, reserveCommand, retryingUnavailable } from "../support/commands.js"
import { acquireScoped, createTestSchema } from "../support/database.js"
import { heldLock, slowCommitPool, slowFirstCommitOfH10, until } from "../support/slowCommit.js"

/** How long the settle for D1 is held after both groups were answered: u2's reload reaches it by then. */
const settleHeldMs = 150

describe("two commits of unknown outcome close together", () => {
  let database: TestSchema
  let admin: pg.Pool
  let pool: pg.Pool
  let coordinator: { value: CoordinatorShape; close: () => Promise<void> }
  let applicationName: string
  let releaseSettle: () => void = () => {}
  let settleHeld: Promise<void> | undefined
  const errors: Array<string> = []
  /** The users of every load the store sent and got an answer to, in order. */
  const loaded: Array<string> = []
  /** The lock the slow COMMITs wait for. */
  let lock: Awaited<ReturnType<typeof heldLock>> | undefined

  beforeAll(async () => {
    database = createTestSchema("doubts_together")
    admin = database.pool({ max: 2 })
    ;({ pool, applicationName } = await slowCommitPool(database.connectionString, database.schema, 10))
    // The store's own statements, except that the first ending of a backend waits for the test.
    const query = pool.query.bind(pool) as (...args: Array<unknown>) => Promise<unknown>
    let held = false
    pool.query = ((...args: Array<unknown>) => {
      const config = args[0] as
        string | { readonly name?: string; readonly text?: string; values?: Array<unknown> }
      const text = typeof config === "string" ? config : config.text
      // Counted once answered: the load's snapshot was taken by then.
      if (typeof config !== "string" && config.name?.startsWith("quota_loadUsers") === true)
        return query(...args).then((result) => {
          loaded.push(...(config.values?.[0] as Array<string>))
          return result
        })
      if (!held && text?.includes("pg_terminate_backend") === true) {
        held = true
        settleHeld = new Promise<void>((resolve) => (releaseSettle = resolve))
        return settleHeld.then(() => query(...args))
      }
      return query(...args)
    }) as typeof pool.query
    const store = await acquireScoped(
      makePostgresStore({ pool, schema: database.schema, partitions: 64, pipelined: true })
    )
    const layer = coordinatorLayer({
      config: defaultConfig,
      sweepIntervalMs: 0,
      actorIdleMs: 60_000,
      onError: (user, message, cause) => errors.push(`${user}: ${message}: ${String(cause)}`)
    }).pipe(Layer.provide(Layer.succeed(Store, store.value)))
    const built = await acquireScoped(
      Effect.gen(function* () {
        const context = yield* Layer.build(layer)
        return Context.get(context, Coordinator)
      })
    )
    coordinator = {
      value: built.value,
      close: async () => {
        await built.close()
        await store.close()
      }
    }
    // The first commit of each user's hold h10 waits in COMMIT for the lock.
    lock = await heldLock(admin)
    await slowFirstCommitOfH10(admin, database.schema, ["u1", "u2"], lock.wait)
  })

  afterAll(async () => {
    releaseSettle()
    await lock?.end()
    await coordinator?.close()
    await pool?.end()
    await database?.drop()
  })

  const submit = (command: Command): Promise<Result> => Effect.runPromise(coordinator.value.submit(command))
  const submitRetrying = retryingUnavailable(submit)
  const reserve = reserveCommand
  const commit = commitCommand

  /** The backends of this test's pool waiting inside COMMIT for the test's lock now. */
  const waitingInCommit = async (): Promise<Array<number>> =>
    (
      await admin.query<{ pid: number }>(
        `select pid from pg_stat_activity
         where application_name = $1 and wait_event_type = 'Lock' and wait_event = 'advisory'
         order by backend_start`,
        [applicationName]
      )
    ).rows.map((row) => row.pid)
  it("loads neither user before both commits are final, and never grants past the limit", async () => {
    for (const user of ["u1", "u2"]) {
      for (const [id, amount] of [
        ["h1", 1],
        ["h10", 10],
        ["h20", 20]
      ] as const)
        expect((await submit(reserve(user, id, amount))).status).toBe("reserved")
      expect((await submit(commit(user, "h1"))).status).toBe("committed")
    }

    // G1's COMMIT is under way on the server, then G2's: two groups, two backends.
    const first = submit(commit("u1", "h10"))
    await until(async () => (await waitingInCommit()).length === 1, "u1's commit to wait")
    const [d1] = await waitingInCommit()
    const second = submit(commit("u2", "h10"))
    await until(async () => (await waitingInCommit()).length === 2, "u2's commit to wait")
    const d2 = (await waitingInCommit()).find((pid) => pid !== d1)!
    expect((await first).status).toBe("unavailable")
    expect((await second).status).toBe("unavailable")
    // The settle for D1 started with u1's reload, before D2 was recorded; u2's reload finds it running.
    await new Promise((resolve) => setTimeout(resolve, settleHeldMs))
    expect(settleHeld, "u1's reload began ending D1").toBeDefined()
    const loadsOfU2 = loaded.filter((user) => user === "u2").length
    releaseSettle()
    // D2 commits now if it is still there: after u2's reload read, or never (it was ended first).
    const d2Gone = async () =>
      ((await admin.query("select 1 from pg_stat_activity where pid = $1", [d2])).rowCount ?? 0) === 0
    await until(
      async () => loaded.filter((user) => user === "u2").length > loadsOfU2 || (await d2Gone()),
      "u2's reload or the end of D2"
    )
    await lock!.release()

    const outcomes: Record<string, unknown> = {}
    for (const user of ["u1", "u2"]) {
      const h20 = await submitRetrying(commit(user, "h20"))
      // The retry of the commit whose outcome was unknown: counted exactly once, whichever way it went.
      const h10 = await submitRetrying(commit(user, "h10"))
      // 31 used of 5 000: 4 979 more would be 5 010.
      const big = await submitRetrying(reserve(user, "big", 4_979))
      outcomes[user] = {
        h20: h20.status,
        h10: h10.status === "exists" ? "committed" : h10.status,
        h10Used: "used" in h10 ? h10.used : undefined,
        big: big.status,
        bigUsed: "used" in big ? big.used : undefined
      }
    }
    const expected = {
      h20: "committed",
      h10: "committed",
      h10Used: 31,
      big: "insufficient_quota",
      bigUsed: 31
    }
    expect(outcomes).toEqual({ u1: expected, u2: expected })

    // The tables are the log's checkpoint: brought up to date before they are read.
    await checkpointAll(admin, database.schema)
    const schema = `"${database.schema}"`
    const totals = await admin.query<{ user_id: string; used: string }>(
      `select user_id, used::text from ${schema}.usage_totals where meter = 'analysis' order by user_id`
    )
    const ledger = await admin.query<{ user_id: string; total: string }>(
      `select user_id, sum(delta)::text as total from ${schema}.usage_ledger where meter = 'analysis'
       group by user_id order by user_id`
    )
    expect({ totals: totals.rows, ledger: ledger.rows }).toEqual({
      totals: [
        { user_id: "u1", used: "31" },
        { user_id: "u2", used: "31" }
      ],
      ledger: [
        { user_id: "u1", total: "31" },
        { user_id: "u2", total: "31" }
      ]
    })
    // Memory was never behind the database: no change was decided again (no ledger key twice).
    const repeated = await admin.query(
      `select user_id, operation, hold_id, key from ${schema}.usage_ledger
       group by 1, 2, 3, 4 having count(*) > 1`
    )
    expect(repeated.rows).toEqual([])
  }, 30_000)
})
