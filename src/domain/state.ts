/**
 * One user's state as its actor holds it. The actor owns the only reference: decisions update it in
 * place and return it (TigerBeetle's state machine does the same), and a failed write makes the actor
 * drop it and load again from the store.
 */
import type { Config, Period } from "./config.js"
import type { ReplyHandle } from "./context.js"
import { clockSkewMaxMs, meterPeriod, planLimit, planNamed } from "./config.js"
import type { HoldRecord, RecalledIds, StoreEvent, StoredUser } from "./events.js"
import { periodStartAt } from "./period.js"
import type { MeterUsage, MeterView, UsageResult } from "./results.js"

export interface Hold extends HoldRecord {
  consumed: number
  state: HoldRecord["state"]
  expiresAt: number
  closedAt: number | null
  /** Consume keys applied to this hold; null until the first (most holds are never consumed). */
  consumeKeys: Set<string> | null
  /** Closed and remembered: the hold that closed next after it (the state's closing order). */
  closedNext: Hold | null
}

export interface MeterState {
  /** The period `used` belongs to; a decision at a later period sees 0. */
  periodStart: number | null
  used: number
  /** Thresholds already announced in this period, ascending (each `usage_threshold` is sent once). */
  thresholdsCrossed: ReadonlyArray<number>
  /** Sum over pending holds of this meter of max(0, amount - consumed). */
  reserved: number
  pendingHolds: number
}

export interface Waiter {
  readonly job: string
  readonly leaseMs: number
  deadlineAt: number
  /** Whoever waits (opaque here): the wakeup that ends the wait hands it back to be answered. */
  readonly reply: ReplyHandle
}

export interface Adjustment {
  readonly meter: string
  readonly amount: number
  readonly at: number
}

/**
 * A user's collections start as shared empty sentinels and get their own Map (or array) on the first
 * write, through `writable`/`writableWaiters`: an empty Map costs ~190 B, and most resident users never
 * touch most of them (memory per resident actor is what the resident cap multiplies). Reads use the
 * fields as they are. The sentinels refuse writes with a crash, so a write that bypasses `writable`
 * fails loudly instead of leaking into every user.
 */
export interface UserState {
  readonly user: string
  plan: string | null
  /** Per-user limits set with `set_limit`; undefined until the first (most users have none). */
  limitOverrides: Map<string, number> | undefined
  meters: ReadonlyMap<string, MeterState>
  pending: ReadonlyMap<string, Hold>
  /**
   * At most the earliest `expiresAt` among the pending holds (Infinity: none can be due). A lower
   * bound, not exact: closing or extending a hold leaves it, and the next scan past it makes it exact
   * again. Expiry and the next deadline read it instead of scanning every pending hold, which for a
   * hot user with thousands pending was most of each decision's CPU.
   */
  pendingExpiresAtLowest: number
  /** Closed holds by id, for lookups; `closedOldest` says which is oldest. */
  closed: ReadonlyMap<string, Hold>
  /**
   * The same closed holds in the order they closed, as a list through `Hold.closedNext` from the
   * oldest to the newest (null: none). Forgetting the oldest reads here, not the front of `closed`: a
   * `Map` keeps deleted entries as holes until V8 rehashes it, so finding its first entry after many
   * deletions from the front walks them all (52.6 µs per reserve+commit for a user at
   * `closedHoldsPerUserMax`, measured). A list through the holds adds no object per user.
   */
  closedOldest: Hold | null
  closedNewest: Hold | null
  /** `adjust` ids in the order they were applied. */
  adjustments: ReadonlyMap<string, Adjustment>
  /**
   * Memory holds only some of the closed holds and `adjust` ids the store remembers (a cap forgot the
   * oldest, or the load read the newest only): before an id memory does not hold is decided, the
   * actor asks the store for it (recall). Cleared only by a load that read everything.
   */
  idsForgotten: boolean
  /**
   * The latest instant a decision of this user was made at (-Infinity: none). Periods are read at the
   * later of it and the clock: a period never goes back, whether the clock stepped back or a process
   * whose clock lags took the user over (loaded from the store's period floor).
   */
  periodFloorAt: number
  /** The day (UTC, days since the epoch) of the floor the store holds; -Infinity when none. */
  periodFloorStoredDay: number
  /** job -> leaseExpiresAt */
  slots: ReadonlyMap<string, number>
  /**
   * At most the earliest `leaseExpiresAt` among the slots (Infinity: none can be due), a lower bound
   * like `pendingExpiresAtLowest` (slots.ts keeps it): a decision reads it instead of walking every
   * slot, which with fairness off (a thousand slots) was most of each decision's cost.
   */
  slotsLeaseExpiresAtLowest: number
  /** FIFO queue of `acquire_slot` callers waiting for a slot. Memory only: a crash ends their wait. */
  waiters: ReadonlyArray<Waiter>
}

/** The collections of a UserState as their writers see them. */
interface WritableCollections {
  readonly meters: Map<string, MeterState>
  readonly pending: Map<string, Hold>
  readonly closed: Map<string, Hold>
  readonly adjustments: Map<string, Adjustment>
  readonly slots: Map<string, number>
}

class NoEntries extends Map<never, never> {
  override set(): never {
    throw new Error("bug: a write to the shared empty collection of a user state (use writable())")
  }
  override delete(): never {
    throw new Error("bug: a write to the shared empty collection of a user state (use writable())")
  }
  override clear(): never {
    throw new Error("bug: a write to the shared empty collection of a user state (use writable())")
  }
}

const noEntries: ReadonlyMap<never, never> = new NoEntries()
const noWaiters: ReadonlyArray<Waiter> = Object.freeze([])
/** Most meters never cross a threshold: they share this empty list. */
export const noThresholdsCrossed: ReadonlyArray<number> = Object.freeze([])

/** The field's own Map, made on the first write. */
export const writable = <Field extends keyof WritableCollections>(
  state: UserState,
  field: Field
): WritableCollections[Field] => {
  const current = state[field]
  if (current !== noEntries) return current as WritableCollections[Field]
  const created = new Map() as WritableCollections[Field]
  ;(state as unknown as Record<Field, WritableCollections[Field]>)[field] = created
  return created
}

/**
 * Gives an emptied collection back to the shared sentinel: most users hold a hold or a slot only now
 * and then, and an empty Map kept for each of them is memory the resident cap multiplies.
 */
export const releaseIfEmpty = (state: UserState, field: "pending" | "slots"): void => {
  if (state[field].size === 0) state[field] = noEntries
}

/** Adds a pending hold (reserved, or loaded pending), lowering the expiry bound to it. */
export const rememberPending = (state: UserState, hold: Hold): void => {
  writable(state, "pending").set(hold.id, hold)
  state.pendingExpiresAtLowest = Math.min(state.pendingExpiresAtLowest, hold.expiresAt)
}

/** Removes a hold from the pending ones; with none left, the expiry bound is exact again (none due). */
export const forgetPending = (state: UserState, hold: Hold): void => {
  writable(state, "pending").delete(hold.id)
  if (state.pending.size === 0) state.pendingExpiresAtLowest = Infinity
  releaseIfEmpty(state, "pending")
}

/** Remembers a hold that has just closed (or was loaded closed, in closing order) as the newest. */
export const rememberClosed = (state: UserState, hold: Hold): void => {
  writable(state, "closed").set(hold.id, hold)
  hold.closedNext = null
  if (state.closedNewest === null) state.closedOldest = hold
  else state.closedNewest.closedNext = hold
  state.closedNewest = hold
}

/** Forgets the oldest closed hold, if any. */
export const forgetOldestClosed = (state: UserState): void => {
  const hold = state.closedOldest
  if (hold === null) return
  state.closedOldest = hold.closedNext
  hold.closedNext = null
  if (state.closedOldest === null) state.closedNewest = null
  writable(state, "closed").delete(hold.id)
  if (state.closed.size === 0) state.closed = noEntries
}

/** The waiters' own array, made on the first write. */
export const writableWaiters = (state: UserState): Array<Waiter> => {
  if (state.waiters === noWaiters) state.waiters = []
  return state.waiters as Array<Waiter>
}

export const emptyUserState = (user: string): UserState => ({
  user,
  plan: null,
  limitOverrides: undefined,
  meters: noEntries,
  pending: noEntries,
  pendingExpiresAtLowest: Infinity,
  closed: noEntries,
  closedOldest: null,
  closedNewest: null,
  adjustments: noEntries,
  idsForgotten: false,
  periodFloorAt: -Infinity,
  periodFloorStoredDay: -Infinity,
  slots: noEntries,
  slotsLeaseExpiresAtLowest: Infinity,
  waiters: noWaiters
})

/** The reserved part of a pending hold: what it may still turn into usage without passing its amount. */
export const holdReserved = (hold: { readonly amount: number; readonly consumed: number }): number =>
  Math.max(0, hold.amount - hold.consumed)

export const planOf = (config: Config, state: UserState): string =>
  state.plan !== null && planNamed(config, state.plan) !== undefined ? state.plan : config.defaultPlan

export const meterLimit = (config: Config, state: UserState, meter: string): number => {
  const override = state.limitOverrides?.get(meter)
  if (override !== undefined) return override
  const plan = planNamed(config, planOf(config, state))
  return plan === undefined ? 0 : planLimit(plan, meter)
}

export const slotLimit = (config: Config, state: UserState): number | null =>
  config.fairness.enabled ? (planNamed(config, planOf(config, state))?.slots ?? 0) : null

/**
 * Whether usage counted in `current` belongs to an earlier period than `at` (so counts as 0 at `at`).
 * A period never goes back: when the clock reads an instant before the period already recorded (an
 * NTP step, or a process whose clock lags the one that wrote the row), the recorded period stays the
 * current one, so neither the reset nor a second grant of the limit can happen, and the earlier
 * period's row is never written again. A meter whose period is `none` (null) never rolls over; a
 * meter that had no period yet (null, from a pending hold loaded before any usage) takes `at`'s.
 */
const periodRolledOver = (current: number | null, at: number | null): boolean =>
  at !== null && (current === null || at > current)

/**
 * The meter's state at `now`, with `used` reset to 0 if its period has rolled over since (and only
 * forward: see periodRolledOver).
 */
export const meterAt = (config: Config, state: UserState, meter: string, now: number): MeterState => {
  const period: Period = meterPeriod(config, meter) ?? "none"
  const periodStart = periodStartAt(period, Math.max(now, state.periodFloorAt))
  let meterState = state.meters.get(meter)
  if (meterState === undefined) {
    meterState = {
      periodStart,
      used: 0,
      thresholdsCrossed: noThresholdsCrossed,
      reserved: 0,
      pendingHolds: 0
    }
    writable(state, "meters").set(meter, meterState)
  } else if (
    periodStart === null
      ? meterState.periodStart !== null
      : periodRolledOver(meterState.periodStart, periodStart)
  ) {
    meterState.periodStart = periodStart
    meterState.used = 0
    meterState.thresholdsCrossed = noThresholdsCrossed
  }
  return meterState
}

export const meterView = (config: Config, state: UserState, meter: string, now: number): MeterView => {
  const meterState = meterAt(config, state, meter, now)
  const limit = meterLimit(config, state, meter)
  const total = meterState.used + meterState.reserved
  return {
    meter,
    limit,
    used: meterState.used,
    reserved: meterState.reserved,
    available: limit - total,
    overage: Math.max(0, total - limit)
  }
}

export const holdRecord = (hold: Hold): HoldRecord => ({
  id: hold.id,
  meter: hold.meter,
  amount: hold.amount,
  consumed: hold.consumed,
  state: hold.state,
  expiresAt: hold.expiresAt,
  createdAt: hold.createdAt,
  closedAt: hold.closedAt
})

export const usageView = (config: Config, state: UserState, now: number): UsageResult => ({
  status: "ok",
  plan: planOf(config, state),
  meters: config.meters.map(({ name, period }): MeterUsage => {
    const view = meterView(config, state, name, now)
    const meterState = meterAt(config, state, name, now)
    return {
      meter: name,
      period,
      periodStart: meterState.periodStart,
      limit: view.limit,
      used: view.used,
      reserved: view.reserved,
      available: view.available,
      overage: view.overage,
      pendingHolds: meterState.pendingHolds
    }
  }),
  slots: {
    limit: slotLimit(config, state),
    held: state.slots.size,
    jobs: [...state.slots].map(([job, leaseExpiresAt]) => ({ job, leaseExpiresAt })),
    waiting: state.waiters.length
  }
})

/**
 * The earliest moment something in this state falls due (hold expiry, lease end, waiter timeout):
 * expiries and lease ends clockSkewMaxMs after their instants (see expireHolds, expireSlots).
 */
export const nextDeadline = (config: Config, state: UserState): number | null => {
  let earliest =
    Math.min(state.pendingExpiresAtLowest, state.slotsLeaseExpiresAtLowest) + clockSkewMaxMs(config)
  for (const waiter of state.waiters) earliest = Math.min(earliest, waiter.deadlineAt)
  return earliest === Infinity ? null : earliest
}

/** Builds the state an actor starts from. Expired holds and leases are left for the first decision to expire, exactly once. */
export const userStateFromStored = (user: string, stored: StoredUser): UserState => {
  const state = emptyUserState(user)
  state.plan = stored.plan
  for (const { meter, limit } of stored.limitOverrides) (state.limitOverrides ??= new Map()).set(meter, limit)
  for (const { meter, periodStart, used, thresholdsCrossed } of stored.usage) {
    writable(state, "meters").set(meter, {
      periodStart,
      used,
      thresholdsCrossed:
        thresholdsCrossed === undefined || thresholdsCrossed.length === 0
          ? noThresholdsCrossed
          : thresholdsCrossed,
      reserved: 0,
      pendingHolds: 0
    })
  }
  const closedInOrder: Array<Hold> = []
  for (const record of stored.holds) {
    const hold: Hold = {
      ...record,
      consumeKeys: record.consumeKeys.length === 0 ? null : new Set(record.consumeKeys),
      closedNext: null
    }
    if (hold.state === "pending") {
      rememberPending(state, hold)
      let meterState = state.meters.get(hold.meter)
      if (meterState === undefined) {
        meterState = {
          periodStart: null,
          used: 0,
          thresholdsCrossed: noThresholdsCrossed,
          reserved: 0,
          pendingHolds: 0
        }
        writable(state, "meters").set(hold.meter, meterState)
      }
      meterState.reserved += holdReserved(hold)
      meterState.pendingHolds += 1
    } else {
      closedInOrder.push(hold)
    }
  }
  closedInOrder.sort((left, right) => (left.closedAt ?? 0) - (right.closedAt ?? 0))
  for (const hold of closedInOrder) rememberClosed(state, hold)
  const adjustmentsInOrder = [...stored.adjustments].sort((left, right) => left.at - right.at)
  for (const { id, meter, amount, at } of adjustmentsInOrder) {
    writable(state, "adjustments").set(id, { meter, amount, at })
  }
  for (const { job, leaseExpiresAt } of stored.slots) {
    writable(state, "slots").set(job, leaseExpiresAt)
    state.slotsLeaseExpiresAtLowest = Math.min(state.slotsLeaseExpiresAtLowest, leaseExpiresAt)
  }
  state.idsForgotten = stored.idsTruncated === true
  if (stored.periodFloorAt !== undefined && stored.periodFloorAt !== null) {
    state.periodFloorAt = stored.periodFloorAt
    state.periodFloorStoredDay = dayOf(stored.periodFloorAt)
  }
  return state
}

const dayMs = 86_400_000
const dayOf = (at: number): number => Math.floor(at / dayMs)

/** A decision is made at `now`: the user's period floor moves up to it (never down). */
export const advancePeriodFloor = (state: UserState, now: number): void => {
  if (now > state.periodFloorAt) state.periodFloorAt = now
}

/**
 * What the store must record so that a reload keeps the user's periods: the floor, when it has reached
 * a day later than the one the store holds (periods are days and months, so once a day is enough).
 * Undefined when the store's floor is as good. Marks it recorded: a failed write reloads the state.
 */
export const periodFloorToStore = (state: UserState): StoreEvent | undefined => {
  if (state.periodFloorAt === -Infinity) return undefined
  const day = dayOf(state.periodFloorAt)
  if (day <= state.periodFloorStoredDay) return undefined
  state.periodFloorStoredDay = day
  return { kind: "period_floor", user: state.user, at: state.periodFloorAt }
}

/**
 * The ids `commands` name that memory does not hold while it may have forgotten some: what the store
 * must be asked for before they are decided (none when memory holds every remembered id).
 */
export const idsToRecall = (
  state: UserState,
  commands: Iterable<{ readonly op: string; readonly id?: string }>
): { holds: Array<string>; adjustments: Array<string> } => {
  const wanted = { holds: [] as Array<string>, adjustments: [] as Array<string> }
  if (!state.idsForgotten) return wanted
  for (const command of commands) {
    const id = command.id
    if (id === undefined) continue
    if (command.op === "adjust") {
      if (!state.adjustments.has(id) && !wanted.adjustments.includes(id)) wanted.adjustments.push(id)
    } else if (!state.pending.has(id) && !state.closed.has(id) && !wanted.holds.includes(id)) {
      wanted.holds.push(id)
    }
  }
  return wanted
}

/**
 * Adds what the store recalled to memory: closed holds as the newest remembered (the cap then forgets
 * others first), `adjust` ids after the rest. Ids memory holds already are left as they are.
 */
export const rememberRecalled = (state: UserState, recalled: RecalledIds): void => {
  for (const record of recalled.holds) {
    if (record.state === "pending" || state.pending.has(record.id) || state.closed.has(record.id)) continue
    rememberClosed(state, {
      ...record,
      consumeKeys: record.consumeKeys.length === 0 ? null : new Set(record.consumeKeys),
      closedNext: null
    })
  }
  for (const { id, meter, amount, at } of recalled.adjustments) {
    if (!state.adjustments.has(id)) writable(state, "adjustments").set(id, { meter, amount, at })
  }
}
