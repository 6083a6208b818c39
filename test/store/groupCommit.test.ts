/**
 * Group commit against Postgres: concurrent writers share few commits, every waiter gets its group's
 * outcome, and a failing group leaves nothing behind.
 */
import { Effect, Fiber, Result } from "effect"
import pg from "pg"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import type { HoldRecord, StoreEvent } from "../../src/domain/events.js"
import type { PostgresStore } from "../../src/store/postgres/PostgresStore.js"
import { makePostgresStore } from "../../src/store/postgres/PostgresStore.js"
import { migrate } from "../../src/store/postgres/migrate.js"
import { acquireScoped, createTestSchema } from "../support/database.js"

const partitions = 8
const now = Date.UTC(2026, 10, 15, 12)
const month = Date.UTC(2026, 10, 1)

const database = createTestSchema("group_commit")
beforeAll(() => Effect.runPromise(migrate(database.pool({ max: 1 }), database.schema)))
afterAll(() => database.drop())

const pendingHold = (id: string, amount = 5): HoldRecord => ({
  id,
  meter: "analysis",
  amount,
  consumed: 0,
  state: "pending",
  expiresAt: now + 60_000,
  createdAt: now,
  closedAt: null
})

/** What one actor's write looks like: a hold consumed once, its ledger row and the new total, a slot. */
const actorWrite = (user: string, index: number, usedAfter = 1): Array<StoreEvent> => [
  { kind: "hold", user, hold: { ...pendingHold(`h${index}`), consumed: 1 } },
  {
    kind: "ledger",
    user,
    meter: "analysis",
    periodStart: month,
    operation: "consume",
    holdId: `h${index}`,
    key: "k",
    requested: 1,
    delta: 1,
    at: now
  },
  { kind: "usage", user, meter: "analysis", periodStart: month, used: usedAfter },
  { kind: "slot", user, job: `job${index}`, leaseExpiresAt: now + 60_000 }
]

const openStore = (pool: pg.Pool, limits: { eventsPerCommitMax?: number; writersMax?: number } = {}) =>
  acquireScoped(makePostgresStore({ pool, schema: database.schema, partitions, ...limits }))

const countRows = async (pool: pg.Pool, table: string, userPrefix: string): Promise<number> => {
  const result = await pool.query<{ count: string }>(
    `select count(*) from "${database.schema}".${table} where user_id like $1`,
    [`${userPrefix}%`]
  )
  return Number(result.rows[0]!.count)
}

/** Waits until the writer has taken everything queued or `queued` submissions wait. */
const waitForQueued = async (store: PostgresStore, queued: number): Promise<void> => {
  for (let attempt = 0; attempt < 1_000; attempt += 1) {
    const stats = await Effect.runPromise(store.commitStats)
    if (stats.queued === queued) return
    await new Promise((resolve) => setTimeout(resolve, 2))
  }
  throw new Error(`never saw ${queued} queued submissions`)
}

describe("GroupCommit over Postgres", () => {
  let store: PostgresStore
  let closeStore: () => Promise<void>
  beforeAll(async () => {
    const opened = await openStore(database.pool({ max: 4 }))
    store = opened.value
    closeStore = opened.close
  })
  afterAll(() => closeStore())

  it("gives 2 000 concurrent writers few commits, and every writer its events", async () => {
    const writers = 2_000
    const before = await Effect.runPromise(store.commitStats)
    const started = performance.now()
    const outcomes = await Effect.runPromise(
      Effect.forEach(
        Array.from({ length: writers }, (_, index) => index),
        (index) => Effect.result(store.write(actorWrite(`many-${index}`, index))),
        { concurrency: "unbounded" }
      )
    )
    const elapsedMs = performance.now() - started
    const after = await Effect.runPromise(store.commitStats)
    const commits = after.commits - before.commits
    expect(outcomes.every(Result.isSuccess)).toBe(true)
    expect(after.failedCommits - before.failedCommits).toBe(0)
    // One commit per writer would be 2 000; the writers share a handful.
    expect(commits).toBeLessThanOrEqual(20)
    const pool = database.pool({ max: 1 })
    expect(await countRows(pool, "holds", "many-")).toBe(writers)
    expect(await countRows(pool, "usage_ledger", "many-")).toBe(writers)
    expect(await countRows(pool, "usage_totals", "many-")).toBe(writers)
    expect(await countRows(pool, "slots", "many-")).toBe(writers)
    console.info(
      `group commit: ${writers} writers x 4 events in ${commits} commits (${((writers * 4) / commits).toFixed(0)} events/commit, largest ${after.largestCommitItems}), ${elapsedMs.toFixed(0)} ms`
    )
  })

  it("shares commits between actors that each keep one write in flight", async () => {
    const actors = 200
    const writesPerActor = 20
    const before = await Effect.runPromise(store.commitStats)
    const started = performance.now()
    await Effect.runPromise(
      Effect.forEach(
        Array.from({ length: actors }, (_, actor) => actor),
        (actor) =>
          Effect.forEach(
            Array.from({ length: writesPerActor }, (_, index) => index),
            (index) => store.write(actorWrite(`actor-${actor}`, index, index + 1)),
            { discard: true }
          ),
        { concurrency: "unbounded", discard: true }
      )
    )
    const elapsedMs = performance.now() - started
    const after = await Effect.runPromise(store.commitStats)
    const commits = after.commits - before.commits
    const writes = actors * writesPerActor
    // Each actor waits for its previous write, so groups form from whoever is waiting: at least
    // writesPerActor commits, and far fewer than one per write.
    expect(commits).toBeGreaterThanOrEqual(writesPerActor)
    expect(commits).toBeLessThanOrEqual(writes / 10)
    expect(await countRows(database.pool({ max: 1 }), "holds", "actor-")).toBe(writes)
    console.info(
      `group commit: ${actors} actors x ${writesPerActor} sequential writes = ${writes} writes in ${commits} commits (${(writes / commits).toFixed(0)} writes/commit), ${elapsedMs.toFixed(0)} ms, ${((writes * 4 * 1000) / elapsedMs).toFixed(0)} events/s`
    )
  })

  it("writes a 1 000-event group in one commit (timed)", async () => {
    const timesMs: Array<number> = []
    for (let round = 0; round < 5; round += 1) {
      const events = Array.from({ length: 250 }, (_, index) =>
        actorWrite(`timed-${round}-${index}`, index)
      ).flat()
      const started = performance.now()
      await Effect.runPromise(store.write(events))
      timesMs.push(performance.now() - started)
    }
    timesMs.sort((left, right) => left - right)
    expect(await countRows(database.pool({ max: 1 }), "holds", "timed-")).toBe(5 * 250)
    console.info(
      `1 000-event commit: median ${timesMs[2]!.toFixed(1)} ms (min ${timesMs[0]!.toFixed(1)}, max ${timesMs[4]!.toFixed(1)})`
    )
  })
})

describe("GroupCommit failures", () => {
  it("keeps each group under the cap, except a single larger submission, alone", async () => {
    const opened = await openStore(database.pool({ max: 2 }), { eventsPerCommitMax: 10 })
    const capped = opened.value
    const outcomes = await Effect.runPromise(
      Effect.forEach(
        Array.from({ length: 50 }, (_, index) => index),
        (index) => Effect.result(capped.write(actorWrite(`capped-${index}`, index).slice(0, 3))),
        { concurrency: "unbounded" }
      )
    )
    expect(outcomes.every(Result.isSuccess)).toBe(true)
    const stats = await Effect.runPromise(capped.commitStats)
    expect(stats.largestCommitItems).toBeLessThanOrEqual(10)
    expect(stats.commits).toBeGreaterThanOrEqual(15)
    const big = Array.from({ length: 12 }, (_, index) => actorWrite("capped-big", index)[0]!)
    const small = actorWrite("capped-small", 0).slice(0, 1)
    await Effect.runPromise(Effect.all([capped.write(big), capped.write(small)], { concurrency: 2 }))
    expect((await Effect.runPromise(capped.commitStats)).largestCommitItems).toBe(12)
    expect(await countRows(database.pool({ max: 1 }), "holds", "capped-")).toBe(50 + 12 + 1)
    await opened.close()
  })

  it("fails only the submission with a bad row; the others of its group are written one by one", async () => {
    const pool = database.pool({ max: 1 })
    // One writer holding the only connection: it takes the pilot and waits, the rest queue behind it.
    const opened = await openStore(pool, { writersMax: 1 })
    const failing = opened.value
    const blocker = await pool.connect()
    const pilot = Effect.runPromise(Effect.result(failing.write(actorWrite("group-pilot", 0))))
    await waitForQueued(failing, 0)
    // A negative amount violates a check constraint (SQLSTATE 23514): this submission's doing alone.
    const bad: Array<StoreEvent> = [{ kind: "hold", user: "group-bad", hold: pendingHold("negative", -1) }]
    const writes = [
      bad,
      ...Array.from({ length: 20 }, (_, index) => actorWrite(`group-good-${index}`, index))
    ]
    const waiting = writes.map((events) => Effect.runPromise(Effect.result(failing.write(events))))
    await waitForQueued(failing, writes.length)
    blocker.release()

    expect(Result.isSuccess(await pilot)).toBe(true)
    const [badOutcome, ...goodOutcomes] = await Promise.all(waiting)
    expect(Result.isFailure(badOutcome!) && badOutcome.failure._tag === "StoreUnavailable").toBe(true)
    for (const outcome of goodOutcomes) expect(Result.isSuccess(outcome)).toBe(true)
    const stats = await Effect.runPromise(failing.commitStats)
    // The pilot, the group that failed, then each of its 21 submissions alone (the bad one failing again).
    expect({ commits: stats.commits, failedCommits: stats.failedCommits }).toEqual({
      commits: 2 + writes.length,
      failedCommits: 2
    })
    for (const table of ["holds", "usage_ledger", "usage_totals", "slots"]) {
      expect(await countRows(pool, table, "group-good-")).toBe(20)
      expect(await countRows(pool, table, "group-pilot")).toBe(1)
      expect(await countRows(pool, table, "group-bad")).toBe(0)
    }
    await opened.close()
  })

  it("fails every waiter when the pool is closed", async () => {
    const pool = database.pool({ max: 2 })
    const opened = await openStore(pool)
    await pool.end()
    const outcomes = await Effect.runPromise(
      Effect.forEach(
        Array.from({ length: 10 }, (_, index) => index),
        (index) => Effect.flip(opened.value.write(actorWrite(`closed-${index}`, index))),
        { concurrency: "unbounded" }
      )
    )
    expect(outcomes.map((error) => error._tag)).toEqual(Array.from({ length: 10 }, () => "StoreUnavailable"))
    expect(await countRows(database.pool({ max: 1 }), "holds", "closed-")).toBe(0)
    await opened.close()
  })

  it("on shutdown finishes the group in flight and fails the queued ones", async () => {
    const pool = database.pool({ max: 1 })
    // One writer: while it waits for the connection, later submissions queue behind it.
    const opened = await openStore(pool, { writersMax: 1 })
    const blocker = await pool.connect()
    const inFlight = Effect.runPromise(Effect.result(opened.value.write(actorWrite("shutdown-in-flight", 0))))
    await waitForQueued(opened.value, 0)
    const queued = [1, 2, 3].map((index) =>
      Effect.runPromise(Effect.result(opened.value.write(actorWrite(`shutdown-queued-${index}`, index))))
    )
    await waitForQueued(opened.value, 3)
    const closing = opened.close()
    blocker.release()
    await closing
    expect(Result.isSuccess(await inFlight)).toBe(true)
    for (const outcome of await Promise.all(queued)) {
      expect(Result.isFailure(outcome) && outcome.failure.reason).toBe("the store is shutting down")
    }
    const after = await Effect.runPromise(Effect.flip(opened.value.write(actorWrite("shutdown-late", 9))))
    expect(after._tag).toBe("StoreUnavailable")
    expect(await countRows(pool, "holds", "shutdown-queued-")).toBe(0)
    expect(await countRows(pool, "holds", "shutdown-in-flight")).toBe(1)
  })
})

describe("GroupCommit over Postgres, pipelined (BEGIN, writes and COMMIT in one round trip)", () => {
  it("commits good groups and applies nothing of a group with one bad event", async () => {
    const pool = new pg.Pool({ connectionString: database.connectionString, max: 2, pipeline: true })
    pool.on("error", () => {})
    const opened = await acquireScoped(
      makePostgresStore({ pool, schema: database.schema, partitions, pipelined: true })
    )
    const good = await Effect.runPromise(Effect.result(opened.value.write(actorWrite("piped-good", 0))))
    expect(Result.isSuccess(good)).toBe(true)
    const mixed = [
      ...actorWrite("piped-mixed", 1),
      { kind: "hold", user: "piped-mixed", hold: pendingHold("negative", -1) } satisfies StoreEvent
    ]
    const failed = await Effect.runPromise(Effect.result(opened.value.write(mixed)))
    expect(Result.isFailure(failed) && failed.failure._tag === "StoreUnavailable").toBe(true)
    const after = await Effect.runPromise(Effect.result(opened.value.write(actorWrite("piped-after", 2))))
    expect(Result.isSuccess(after)).toBe(true)
    const counter = database.pool({ max: 1 })
    for (const table of ["holds", "usage_ledger", "usage_totals", "slots"]) {
      expect(await countRows(counter, table, "piped-good")).toBe(1)
      expect(await countRows(counter, table, "piped-mixed")).toBe(0)
      expect(await countRows(counter, table, "piped-after")).toBe(1)
    }
    await opened.close()
    await pool.end()
  })
})

describe("GroupCommit withdrawals", () => {
  it("withdraws a submission still waiting for a writer when its waiter is interrupted", async () => {
    const pool = database.pool({ max: 1 })
    const opened = await openStore(pool, { writersMax: 1 })
    const blocker = await pool.connect()
    const first = Effect.runPromise(Effect.result(opened.value.write(actorWrite("withdraw-first", 0))))
    await waitForQueued(opened.value, 0)
    // Its actor is dropped (a partition handed off) while the write waits behind the first.
    const dropped = Effect.runFork(opened.value.write(actorWrite("withdraw-dropped", 1)))
    await waitForQueued(opened.value, 1)
    await Effect.runPromise(Fiber.interrupt(dropped))
    expect((await Effect.runPromise(opened.value.commitStats)).queued).toBe(0)
    blocker.release()
    expect(Result.isSuccess(await first)).toBe(true)
    // A later write still commits: the writer was not disturbed by the withdrawal.
    await Effect.runPromise(opened.value.write(actorWrite("withdraw-later", 2)))
    expect(await countRows(pool, "holds", "withdraw-first")).toBe(1)
    expect(await countRows(pool, "holds", "withdraw-dropped")).toBe(0)
    expect(await countRows(pool, "holds", "withdraw-later")).toBe(1)
    await opened.close()
  })
})

describe("prepared statement names on a shared pool", () => {
  it("refuses a second store whose schema's statement names clash with the first's", async () => {
    // fnv1a32("s_33zx") === fnv1a32("s_epad"): same names, different texts. A pipelined group would
    // have its clashing statement refused by pg on the client and still send COMMIT for the rest.
    const pool = new pg.Pool({ connectionString: database.connectionString, max: 1, pipeline: true })
    pool.on("error", () => {})
    const first = await acquireScoped(
      makePostgresStore({ pool, schema: "s_33zx", partitions, pipelined: true })
    )
    const again = await acquireScoped(makePostgresStore({ pool, schema: "s_33zx", partitions }))
    const clashing = await Effect.runPromise(
      Effect.exit(Effect.scoped(makePostgresStore({ pool, schema: "s_epad", partitions, pipelined: true })))
    )
    expect(String(clashing)).toContain("is already used on this pool for another schema")
    // Its own pool is fine.
    const ownPool = new pg.Pool({ connectionString: database.connectionString, max: 1 })
    const separate = await acquireScoped(makePostgresStore({ pool: ownPool, schema: "s_epad", partitions }))
    await Promise.all([first.close(), again.close(), separate.close()])
    await Promise.all([pool.end(), ownPool.end()])
  })
})
