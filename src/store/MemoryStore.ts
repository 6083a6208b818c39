/**
 * The store in memory, for the actor and property tests. It keeps rows as Postgres would (holds, ledger,
 * usage totals, slots, plans, limits) and rebuilds a StoredUser from them, so a "crash" that drops
 * every actor and reloads exercises the same load path as production.
 */
import { Effect, Layer } from "effect"
import type { HoldRecord, QuotaEvent, StoreEvent, StoredUser } from "../domain/events.js"
import { consumeKeyClockSlackMs, idRetentionMs, partitionsDefault } from "../domain/limits.js"
import { partitionOf } from "../domain/partition.js"
import type { StoreShape } from "./Store.js"
import { Store, StoreUnavailable } from "./Store.js"

interface LedgerRow {
  readonly meter: string
  readonly periodStart: number | null
  readonly operation: "consume" | "commit" | "adjust"
  readonly holdId: string | null
  readonly key: string
  readonly requested: number
  readonly delta: number
  readonly at: number
}

export interface MemoryUserRows {
  plan: string | null
  periodFloorAt: number | null
  readonly limits: Map<string, number>
  readonly holds: Map<string, HoldRecord>
  readonly ledger: Array<LedgerRow>
  /** `${meter}|${periodStart}` -> used and the thresholds announced */
  readonly usage: Map<string, UsageRow>
  readonly slots: Map<string, number>
  /** The user's recorded events, in the order they were written (the outbox; nothing publishes here). */
  readonly events: Array<QuotaEvent>
}

interface UsageRow {
  readonly meter: string
  readonly periodStart: number | null
  readonly used: number
  readonly thresholdsCrossed: ReadonlyArray<number>
}

export interface MemoryStoreOptions {
  /** Awaited before each write is applied: tests inject delays, failures and fc.scheduler points here. */
  readonly beforeWrite?: (events: ReadonlyArray<StoreEvent>) => Promise<void>
  /** Awaited before each load. */
  readonly beforeLoad?: (user: string) => Promise<void>
  /**
   * A write whose outcome is unknown (as Postgres's WriteOutcomeUnknown: a COMMIT sent and never
   * answered). Asked for each write once it would apply (after beforeWrite and the fence check);
   * undefined: the write applies as usual. A promise: the write fails at once (StoreUnavailable, as a
   * timeout) and its events are applied when the promise resolves true, dropped when it resolves
   * false: the test decides, as the server does when it commits or rolls back later.
   */
  readonly outcomeUnknown?: (events: ReadonlyArray<StoreEvent>) => Promise<boolean> | undefined
  /**
   * Default true: a load first waits until every write of unknown outcome is settled (applied or
   * dropped), the contract the Postgres store keeps (outcomeDoubts.ts), so no actor reloads a state a
   * late commit will still change. false breaks it, only to show that the properties catch the
   * difference (test/property/lifecycle.test.ts).
   */
  readonly settleBeforeLoad?: boolean
  /** The deployment's partition count, for listUsage (default partitionsDefault). */
  readonly partitions?: number
}

export interface MemoryStore extends StoreShape {
  readonly rows: Map<string, MemoryUserRows>
  /** Ledger keys seen twice: must stay 0 (nothing applied twice). */
  readonly duplicateLedgerKeys: () => number
  /**
   * Models a crash's fencing: writes that started before this call fail instead of applying, as a
   * superseded owner's transaction fails its epoch check in Postgres.
   */
  readonly fence: () => void
  /** Writes of unknown outcome not settled yet (applied or dropped). */
  readonly unsettledWrites: () => number
}

const rowsOf = (rows: Map<string, MemoryUserRows>, user: string): MemoryUserRows => {
  let userRows = rows.get(user)
  if (userRows === undefined) {
    userRows = {
      plan: null,
      periodFloorAt: null,
      limits: new Map(),
      holds: new Map(),
      ledger: [],
      usage: new Map(),
      slots: new Map(),
      events: []
    }
    rows.set(user, userRows)
  }
  return userRows
}

/**
 * Unique within one retention window of `at`, as usage_ledger_applied_once in Postgres: an id the
 * decisions forgot after the retry window may be applied again, always in a later window.
 */
const ledgerKey = (row: { operation: string; holdId: string | null; key: string; at: number }): string =>
  `${row.operation}|${row.holdId ?? ""}|${row.key}|${Math.floor(row.at / idRetentionMs)}`

export const makeMemoryStore = (options: MemoryStoreOptions = {}): MemoryStore => {
  const rows = new Map<string, MemoryUserRows>()
  let duplicates = 0
  let epoch = 0
  /** Writes of unknown outcome not settled yet; a load waits for all of them (settleBeforeLoad). */
  const doubts = new Set<Promise<void>>()
  const settleBeforeLoad = options.settleBeforeLoad ?? true
  const seenLedgerKeys = new Map<string, Set<string>>()

  const apply = (event: StoreEvent): void => {
    const userRows = rowsOf(rows, event.user)
    switch (event.kind) {
      case "hold":
        userRows.holds.set(event.hold.id, event.hold)
        return
      case "ledger": {
        const seen = seenLedgerKeys.get(event.user) ?? new Set<string>()
        seenLedgerKeys.set(event.user, seen)
        const key = ledgerKey(event)
        if (seen.has(key)) duplicates += 1
        seen.add(key)
        userRows.ledger.push(event)
        return
      }
      case "usage":
        userRows.usage.set(`${event.meter}|${event.periodStart}`, {
          meter: event.meter,
          periodStart: event.periodStart,
          used: event.used,
          thresholdsCrossed: event.thresholdsCrossed ?? []
        })
        return
      case "event":
        userRows.events.push(event.event)
        return
      case "slot":
        userRows.slots.set(event.job, event.leaseExpiresAt)
        return
      case "slot_freed":
        userRows.slots.delete(event.job)
        return
      case "plan":
        userRows.plan = event.plan
        return
      case "period_floor":
        userRows.periodFloorAt = Math.max(userRows.periodFloorAt ?? -Infinity, event.at)
        return
      case "limit":
        if (event.limit === null) userRows.limits.delete(event.meter)
        else userRows.limits.set(event.meter, event.limit)
        return
    }
  }

  const loadRows = (user: string, now: number): StoredUser => {
    const userRows = rows.get(user)
    if (userRows === undefined) {
      return { plan: null, limitOverrides: [], usage: [], holds: [], adjustments: [], slots: [] }
    }
    const cutoff = now - idRetentionMs
    const latestUsage = new Map<string, UsageRow>()
    for (const row of userRows.usage.values()) {
      const current = latestUsage.get(row.meter)
      if (current === undefined || (row.periodStart ?? 0) >= (current.periodStart ?? 0))
        latestUsage.set(row.meter, row)
    }
    const consumeKeys = new Map<string, Array<string>>()
    for (const entry of userRows.ledger) {
      if (entry.operation !== "consume" || entry.holdId === null) continue
      // Only the current hold's keys: a hold id reused after retention starts with none.
      if (entry.at < (userRows.holds.get(entry.holdId)?.createdAt ?? Infinity) - consumeKeyClockSlackMs)
        continue
      const keys = consumeKeys.get(entry.holdId) ?? []
      keys.push(entry.key)
      consumeKeys.set(entry.holdId, keys)
    }
    return {
      plan: userRows.plan,
      ...(userRows.periodFloorAt === null ? {} : { periodFloorAt: userRows.periodFloorAt }),
      limitOverrides: [...userRows.limits].map(([meter, limit]) => ({ meter, limit })),
      usage: [...latestUsage.values()],
      holds: [...userRows.holds.values()]
        .filter((hold) => hold.state === "pending" || (hold.closedAt ?? 0) >= cutoff)
        .map((hold) => ({ ...hold, consumeKeys: consumeKeys.get(hold.id) ?? [] })),
      adjustments: userRows.ledger
        .filter((entry) => entry.operation === "adjust" && entry.at >= cutoff)
        .map((entry) => ({ id: entry.key, meter: entry.meter, amount: entry.requested, at: entry.at })),
      slots: [...userRows.slots].map(([job, leaseExpiresAt]) => ({ job, leaseExpiresAt }))
    }
  }

  const toUnavailable = (cause: unknown) => new StoreUnavailable({ reason: String(cause), cause })

  return {
    rows,
    duplicateLedgerKeys: () => duplicates,
    fence: () => {
      epoch += 1
    },
    unsettledWrites: () => doubts.size,
    loadUsers: (users, now) =>
      Effect.tryPromise({
        try: async () => {
          if (options.beforeLoad !== undefined) await Promise.all(users.map(options.beforeLoad))
          // Those that start while it waits included: the load reads only once none is left.
          while (settleBeforeLoad && doubts.size > 0) await Promise.all(doubts)
          return new Map(users.map((user) => [user, loadRows(user, now)]))
        },
        catch: toUnavailable
      }),
    write: (events) =>
      Effect.tryPromise({
        try: async () => {
          const startedInEpoch = epoch
          if (options.beforeWrite !== undefined) await options.beforeWrite(events)
          if (startedInEpoch !== epoch) throw new Error("fenced: the writer was superseded")
          const outcome = options.outcomeUnknown?.(events)
          if (outcome !== undefined) {
            // Its fence check passed: whether it lands is the server's to decide, not a later fence's.
            const settled: Promise<void> = outcome.then(
              (applied) => {
                if (applied) for (const event of events) apply(event)
                doubts.delete(settled)
              },
              () => {
                doubts.delete(settled)
              }
            )
            doubts.add(settled)
            throw new Error("the outcome of the commit is unknown (no answer to COMMIT)")
          }
          for (const event of events) apply(event)
        },
        catch: toUnavailable
      }),
    // Writes apply to the rows at once: there is no log to bring into them.
    writesCheckpointed: true,
    checkpoint: (_partition, _known, through) => Effect.succeed(through),
    openPartition: () => Effect.succeed({ nextPosition: 1 }),
    recall: (user, ids, now) =>
      Effect.sync(() => {
        const stored = loadRows(user, now)
        return {
          holds: stored.holds.filter((hold) => hold.state !== "pending" && ids.holds.includes(hold.id)),
          adjustments: stored.adjustments.filter((adjustment) => ids.adjustments.includes(adjustment.id))
        }
      }),
    usersWithExpiries: (now, limit) =>
      Effect.sync(() => {
        const users: Array<string> = []
        for (const [user, userRows] of rows) {
          if (users.length >= limit) break
          const holdDue = [...userRows.holds.values()].some(
            (hold) => hold.state === "pending" && hold.expiresAt <= now
          )
          const slotDue = [...userRows.slots.values()].some((leaseExpiresAt) => leaseExpiresAt <= now)
          if (holdDue || slotDue) users.push(user)
        }
        return users
      }),
    pastUsage: (user, meters, periodsMax) =>
      Effect.sync(() => {
        const usage = [...(rows.get(user)?.usage.values() ?? [])]
        return meters.flatMap((meter) =>
          usage
            .filter((row) => row.meter === meter && row.used > 0)
            .sort((a, b) => (b.periodStart ?? -1) - (a.periodStart ?? -1))
            .slice(0, periodsMax)
            .map(({ periodStart, used }) => ({ meter, periodStart, used }))
        )
      }),
    listUsage: (query) =>
      Effect.sync(() => {
        const partitions = options.partitions ?? partitionsDefault
        const byBytes = (user: string) => Buffer.from(user, "utf8")
        const after = byBytes(query.after ?? "")
        const listed = [...rows.entries()]
          .filter(([user]) => partitionOf(user, partitions) === query.partition)
          .filter(([user]) => Buffer.compare(byBytes(user), after) > 0)
          .flatMap(([user, userRows]) => {
            const used = userRows.usage.get(`${query.meter}|${query.periodStart}`)?.used ?? 0
            return used > 0 ? [{ user, used }] : []
          })
          .sort((a, b) => Buffer.compare(byBytes(a.user), byBytes(b.user)))
        return { usage: listed.slice(0, query.limit), more: listed.length > query.limit }
      }),
    ping: Effect.void
  }
}

export const memoryStoreLayer = (store: MemoryStore = makeMemoryStore()): Layer.Layer<Store> =>
  Layer.succeed(Store, store)
