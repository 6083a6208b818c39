/**
 * The store in memory, for the actor and property tests. It keeps rows as Postgres would (holds, ledger,
 * usage totals, slots, plans, limits) and rebuilds a StoredUser from them, so a "crash" that drops
 * every actor and reloads exercises the same load path as production.
 */
import { Effect, Layer } from "effect"
import type { HoldRecord, QuotaEvent, StoreEvent, StoredUser } from "../domain/events.js"
import { idRetentionMs } from "../domain/limits.js"
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
}

const rowsOf = (rows: Map<string, MemoryUserRows>, user: string): MemoryUserRows => {
  let userRows = rows.get(user)
  if (userRows === undefined) {
    userRows = {
      plan: null,
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
      if (entry.at < (userRows.holds.get(entry.holdId)?.createdAt ?? Infinity)) continue
      const keys = consumeKeys.get(entry.holdId) ?? []
      keys.push(entry.key)
      consumeKeys.set(entry.holdId, keys)
    }
    return {
      plan: userRows.plan,
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
    load: (user, now) =>
      Effect.tryPromise({
        try: async () => {
          if (options.beforeLoad !== undefined) await options.beforeLoad(user)
          return loadRows(user, now)
        },
        catch: toUnavailable
      }),
    write: (events) =>
      Effect.tryPromise({
        try: async () => {
          const startedInEpoch = epoch
          if (options.beforeWrite !== undefined) await options.beforeWrite(events)
          if (startedInEpoch !== epoch) throw new Error("fenced: the writer was superseded")
          for (const event of events) apply(event)
        },
        catch: toUnavailable
      }),
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
    ping: Effect.void
  }
}

export const memoryStoreLayer = (store: MemoryStore = makeMemoryStore()): Layer.Layer<Store> =>
  Layer.succeed(Store, store)
