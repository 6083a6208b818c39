/**
 * Every event kind written to Postgres and loaded back, checked against what the in-memory store
 * (an independent implementation of the same semantics) loads for the same events.
 */
import { Effect } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import type { HoldRecord, StoreEvent, StoredUser } from "../../src/domain/events.js"
import { emptyStoredUser } from "../../src/domain/events.js"
import { amountMax, idRetentionMs } from "../../src/domain/limits.js"
import { partitionOf } from "../../src/domain/partition.js"
import { makeMemoryStore } from "../../src/store/MemoryStore.js"
import type { PostgresStore } from "../../src/store/postgres/PostgresStore.js"
import { makePostgresStore } from "../../src/store/postgres/PostgresStore.js"
import { migrate } from "../../src/store/postgres/migrate.js"
import { acquireScoped, createTestSchema } from "../support/database.js"
import { loadUser } from "../support/loadUser.js"

const partitions = 16
const now = Date.UTC(2026, 10, 15, 12)
const month = Date.UTC(2026, 10, 1)
const previousMonth = Date.UTC(2026, 9, 1)
const day = 86_400_000

const database = createTestSchema("roundtrip")
let store: PostgresStore
let closeStore: () => Promise<void>

beforeAll(async () => {
  const pool = database.pool()
  await Effect.runPromise(migrate(pool, database.schema))
  const opened = await acquireScoped(makePostgresStore({ pool, schema: database.schema, partitions }))
  store = opened.value
  closeStore = opened.close
})
afterAll(async () => {
  await closeStore()
  await database.drop()
})

const hold = (id: string, overrides: Partial<HoldRecord> = {}): HoldRecord => ({
  id,
  meter: "analysis",
  amount: 10,
  consumed: 0,
  state: "pending",
  expiresAt: now + 3_600_000,
  createdAt: now - 1_000,
  closedAt: null,
  ...overrides
})

const ledger = (
  user: string,
  entry: Partial<Extract<StoreEvent, { kind: "ledger" }>> &
    Pick<Extract<StoreEvent, { kind: "ledger" }>, "operation" | "key">
): StoreEvent => ({
  kind: "ledger",
  user,
  meter: "analysis",
  periodStart: month,
  holdId: null,
  requested: 1,
  delta: 1,
  at: now - 1_000,
  ...entry
})

/** One user's history touching every event kind, with rows repeated so that collapsing matters. */
const historyOf = (user: string): Array<StoreEvent> => [
  { kind: "plan", user, plan: "free" },
  { kind: "plan", user, plan: "pro" },
  { kind: "limit", user, meter: "analysis", limit: 7 },
  { kind: "limit", user, meter: "tokens", limit: amountMax },
  { kind: "limit", user, meter: "analysis", limit: null },
  { kind: "limit", user, meter: "specview", limit: 0 },
  { kind: "hold", user, hold: hold("pending-1") },
  { kind: "hold", user, hold: hold("pending-1", { consumed: 3 }) },
  ledger(user, { operation: "consume", holdId: "pending-1", key: "k1", requested: 3, delta: 3 }),
  { kind: "hold", user, hold: hold("pending-1", { consumed: 5, expiresAt: now + 7_200_000 }) },
  ledger(user, {
    operation: "consume",
    holdId: "pending-1",
    key: 'k 2 "quoted" {x,y} \\',
    requested: 2,
    delta: 2
  }),
  { kind: "hold", user, hold: hold("committed-1", { amount: 4 }) },
  {
    kind: "hold",
    user,
    hold: hold("committed-1", { amount: 4, consumed: 6, state: "committed", closedAt: now - 500 })
  },
  ledger(user, { operation: "commit", holdId: "committed-1", key: "", requested: 6, delta: 6 }),
  { kind: "hold", user, hold: hold("released-1", { state: "released", closedAt: now - idRetentionMs }) },
  { kind: "hold", user, hold: hold("forgotten-1", { state: "expired", closedAt: now - idRetentionMs - 1 }) },
  ledger(user, { operation: "adjust", key: "adj-recent", requested: -4, delta: -4 }),
  ledger(user, {
    operation: "adjust",
    key: "adj-old",
    requested: 9,
    delta: 9,
    at: now - idRetentionMs - day
  }),
  ledger(user, { operation: "adjust", key: "adj-prev", periodStart: previousMonth, requested: 2, delta: 2 }),
  ledger(user, {
    operation: "adjust",
    key: "adj-storage",
    meter: "storage_bytes",
    periodStart: null,
    requested: amountMax,
    delta: amountMax
  }),
  { kind: "usage", user, meter: "analysis", periodStart: previousMonth, used: 2 },
  { kind: "usage", user, meter: "analysis", periodStart: month, used: 3 },
  { kind: "usage", user, meter: "analysis", periodStart: month, used: 16, thresholdsCrossed: [0.5, 1] },
  {
    kind: "usage",
    user,
    meter: "storage_bytes",
    periodStart: null,
    used: amountMax,
    thresholdsCrossed: [1.25]
  },
  { kind: "slot", user, job: "job-a", leaseExpiresAt: now + 60_000 },
  { kind: "slot", user, job: "job-b", leaseExpiresAt: now + 60_000 },
  { kind: "slot_freed", user, job: "job-b", reason: "released" },
  { kind: "slot", user, job: "job-c", leaseExpiresAt: now + 1_000 },
  { kind: "slot_freed", user, job: "job-c", reason: "expired" },
  { kind: "slot", user, job: "job-c", leaseExpiresAt: now + 120_000 },
  { kind: "slot", user, job: "job-a", leaseExpiresAt: now + 90_000 }
]

/** StoredUser with every array in a canonical order (neither store promises an order). */
const canonical = (stored: StoredUser): StoredUser => {
  const by =
    <T>(key: (item: T) => string) =>
    (left: T, right: T) =>
      key(left).localeCompare(key(right))
  return {
    plan: stored.plan,
    limitOverrides: [...stored.limitOverrides].sort(by((item) => item.meter)),
    usage: [...stored.usage].sort(by((item) => item.meter)),
    holds: [...stored.holds]
      .map((item) => ({ ...item, consumeKeys: [...item.consumeKeys].sort() }))
      .sort(by((item) => item.id)),
    adjustments: [...stored.adjustments].sort(by((item) => item.id)),
    slots: [...stored.slots].sort(by((item) => item.job))
  }
}

const memoryLoad = async (events: ReadonlyArray<StoreEvent>, user: string): Promise<StoredUser> => {
  const memory = makeMemoryStore()
  await Effect.runPromise(memory.write(events))
  return Effect.runPromise(loadUser(memory, user, now))
}

describe("PostgresStore round trip", () => {
  it("loads what the memory store loads, every event kind in one write", async () => {
    const user = 'user-one-write é "q" {a,b}'
    const events = historyOf(user)
    await Effect.runPromise(store.write(events))
    const loaded = canonical(await Effect.runPromise(loadUser(store, user, now)))
    expect(loaded).toEqual(canonical(await memoryLoad(events, user)))
    // The expectations the comparison rests on, so that two equally wrong stores cannot pass.
    expect(loaded.plan).toBe("pro")
    expect(loaded.limitOverrides).toEqual([
      { meter: "specview", limit: 0 },
      { meter: "tokens", limit: amountMax }
    ])
    expect(loaded.usage).toEqual([
      { meter: "analysis", periodStart: month, used: 16, thresholdsCrossed: [0.5, 1] },
      { meter: "storage_bytes", periodStart: null, used: amountMax, thresholdsCrossed: [1.25] }
    ])
    expect(loaded.holds.map((item) => item.id)).toEqual(["committed-1", "pending-1", "released-1"])
    expect(loaded.holds.find((item) => item.id === "pending-1")).toEqual({
      ...hold("pending-1", { consumed: 5, expiresAt: now + 7_200_000 }),
      consumeKeys: ['k 2 "quoted" {x,y} \\', "k1"].sort()
    })
    expect(loaded.adjustments.map((item) => item.id)).toEqual(["adj-prev", "adj-recent", "adj-storage"])
    expect(loaded.adjustments.find((item) => item.id === "adj-recent")?.amount).toBe(-4)
    expect(loaded.slots).toEqual([
      { job: "job-a", leaseExpiresAt: now + 90_000 },
      { job: "job-c", leaseExpiresAt: now + 120_000 }
    ])
  })

  it("loads the same whether the events came in one write or one write each", async () => {
    const user = "user-many-writes"
    const events = historyOf(user)
    for (const event of events) await Effect.runPromise(store.write([event]))
    const loaded = canonical(await Effect.runPromise(loadUser(store, user, now)))
    expect(loaded).toEqual(canonical(await memoryLoad(events, user)))
    expect(loaded.holds).toHaveLength(3)
  })

  it("loads each user the same when many load at once (one batched query) as when loaded alone", async () => {
    const users = Array.from({ length: 40 }, (_, index) => `user-batch-${index} "q" {a,b}`)
    // Every other user has a history, told apart by a plan of its own; the rest were never written.
    const eventsOf = (user: string, index: number): ReadonlyArray<StoreEvent> => [
      ...historyOf(user),
      { kind: "plan", user, plan: `plan-${index}` }
    ]
    for (const [index, user] of users.entries()) {
      if (index % 2 === 0) await Effect.runPromise(store.write(eventsOf(user, index)))
    }
    const together = await Effect.runPromise(
      Effect.all(
        [...users, users[0]!].map((user) => loadUser(store, user, now)),
        { concurrency: "unbounded" }
      )
    )
    for (const [index, user] of users.entries()) {
      const alone = await Effect.runPromise(loadUser(store, user, now))
      expect(canonical(together[index]!)).toEqual(canonical(alone))
      expect(canonical(alone)).toEqual(
        index % 2 === 0
          ? canonical(await memoryLoad(eventsOf(user, index), user))
          : canonical(emptyStoredUser)
      )
      expect(together[index]!.plan).toBe(index % 2 === 0 ? `plan-${index}` : null)
    }
    // The same user asked for twice in one batch gets the same answer twice.
    expect(together[users.length]).toEqual(together[0])
  })

  it("loads a user never written as the empty user", async () => {
    expect(await Effect.runPromise(loadUser(store, "nobody", now))).toEqual(emptyStoredUser)
  })

  it("writes each hold and slot with the user's partition", async () => {
    const user = "user-partition"
    await Effect.runPromise(
      store.write([
        { kind: "hold", user, hold: hold("h") },
        { kind: "slot", user, job: "j", leaseExpiresAt: now }
      ])
    )
    const pool = database.pool({ max: 1 })
    const rows = await pool.query(
      `select partition from "${database.schema}".holds where user_id = $1
       union all select partition from "${database.schema}".slots where user_id = $1`,
      [user]
    )
    expect(rows.rows).toEqual([
      { partition: partitionOf(user, partitions) },
      { partition: partitionOf(user, partitions) }
    ])
  })

  it("finds users whose holds or slot leases are due, each once, at most `limit`", async () => {
    const at = now + 10 * day
    const events: Array<StoreEvent> = [
      { kind: "hold", user: "due-hold", hold: hold("a", { expiresAt: at }) },
      { kind: "hold", user: "due-hold", hold: hold("b", { expiresAt: at - 5 }) },
      {
        kind: "hold",
        user: "due-closed",
        hold: hold("c", { expiresAt: at - 5, state: "released", closedAt: now })
      },
      { kind: "hold", user: "due-later", hold: hold("d", { expiresAt: at + 1 }) },
      { kind: "slot", user: "due-slot", job: "j", leaseExpiresAt: at },
      { kind: "slot", user: "due-hold", job: "j", leaseExpiresAt: at - 1 },
      { kind: "slot", user: "due-slot-later", job: "j", leaseExpiresAt: at + 1 }
    ]
    await Effect.runPromise(store.write(events))
    const due = await Effect.runPromise(store.usersWithExpiries(at, 100))
    const relevant = due.filter((user) => user.startsWith("due-")).sort()
    expect(relevant).toEqual(["due-hold", "due-slot"])
    expect(await Effect.runPromise(store.usersWithExpiries(at, 1))).toHaveLength(1)
  })

  it("stores and loads users, hold ids, consume keys, adjust ids and jobs holding U+0000", async () => {
    // Identifiers that a careless escape would confuse: U+0000, backslashes, the store's marker.
    const odd = ["\u0000", "\\0", "\uffff\\0", "\uffff", "a\u0000\\"]
    const users = odd.map((text) => `user${text}`)
    const historyWith = (user: string): Array<StoreEvent> => [
      ...odd.map((id): StoreEvent => ({ kind: "hold", user, hold: hold(`h${id}`, { expiresAt: now - 1 }) })),
      ...odd.map((key) => ledger(user, { operation: "consume", holdId: "h\u0000", key: `k${key}` })),
      ...odd.map((id) => ledger(user, { operation: "adjust", key: `adj${id}`, requested: 1, delta: 1 })),
      ...odd.map((job): StoreEvent => ({
        kind: "slot",
        user,
        job: `job${job}`,
        leaseExpiresAt: now + 60_000
      })),
      { kind: "slot_freed", user, job: "job\u0000", reason: "released" },
      { kind: "usage", user, meter: "analysis", periodStart: month, used: odd.length * 2 },
      { kind: "plan", user, plan: "pro" },
      { kind: "limit", user, meter: "tokens", limit: 9 },
      { kind: "limit", user, meter: "specview", limit: 3 },
      { kind: "limit", user, meter: "specview", limit: null }
    ]
    for (const user of users) await Effect.runPromise(store.write(historyWith(user)))
    for (const user of users) {
      const loaded = canonical(await Effect.runPromise(loadUser(store, user, now)))
      expect(loaded).toEqual(canonical(await memoryLoad(historyWith(user), user)))
      expect(loaded.holds.map((item) => item.id).sort()).toEqual(odd.map((id) => `h${id}`).sort())
      expect(loaded.holds.find((item) => item.id === "h\u0000")?.consumeKeys).toEqual(
        odd.map((key) => `k${key}`).sort()
      )
      expect(loaded.slots.map((slot) => slot.job).sort()).toEqual(
        odd
          .filter((job) => job !== "\u0000")
          .map((job) => `job${job}`)
          .sort()
      )
    }
    // Each hold is due: the sweep names every one of these users, as they were written.
    const due = await Effect.runPromise(store.usersWithExpiries(now, 10_000))
    expect(users.filter((user) => due.includes(user))).toEqual(users)
    // The views tests pair with the actors name them as written too, and find their totals whole.
    const states = await Effect.runPromise(store.meterStates())
    for (const user of users) {
      expect(states.filter((state) => state.user === user)).toEqual([
        { user, meter: "analysis", periodStart: month, used: odd.length * 2, reserved: 50, pendingHolds: 5 }
      ])
    }
    expect(await Effect.runPromise(store.reconcile())).toEqual([])
  })

  it("keeps the running totals equal to the ledger sums", async () => {
    expect(await Effect.runPromise(store.reconcile())).toEqual([])
  })
})
