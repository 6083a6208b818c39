/**
 * An independent model of PROTOCOL.md v1, for the property tests: the auditor that predicts every reply.
 *
 * Written from the protocol, not from src/domain, and kept deliberately plain so it is obviously right:
 * - a hold is a record in a list, never forgotten (the properties stay inside the 7-day retry window);
 * - `reserved` and `pendingHolds` are recounted from the holds on every read, never kept as counters;
 * - usage is one (periodStart, used) pair per meter, read as 0 once its period is over; a period never
 *   goes back: per user, the period of its latest decision stays current while the clock reads earlier;
 * - time is a list of events processed in order (hold expiry, lease end, waiter timeout), each at its
 *   own moment, whatever size the jump;
 * - the events a decision records (PROTOCOL.md "Events") are appended to the user's `events`: expiries
 *   when they fall due, `plan_changed` / `limit_changed` when the command changes what is stored, and,
 *   after every decision, each threshold whose `used >= threshold x limit` holds for the first time in
 *   the period (the protocol's definition, checked on every meter whatever the command was).
 * The state is plain JSON-able data, so a property can copy it (`structuredClone`) to keep several
 * possible worlds when a reply was `unavailable` and its effect is unknown.
 *
 * Only types and the configuration's shape come from src/domain.
 */
import type { Command } from "../../src/domain/commands.js"
import type { Config, Period } from "../../src/domain/config.js"
import type { QuotaEvent } from "../../src/domain/events.js"
import { holdListReplyBytesMax } from "../../src/domain/limits.js"
import type { Result } from "../../src/domain/results.js"

export const amountMax = 2 ** 53 - 1
const dayMs = 86_400_000

/** Stands for "any retryAfterMs in [snoozeBase, snoozeBase + jitter)" in a predicted `busy`. */
export const anyRetryAfterMs = -1

type HoldState = "pending" | "committed" | "released" | "expired"

export interface ModelHold {
  readonly id: string
  readonly meter: string
  readonly amount: number
  consumed: number
  state: HoldState
  expiresAt: number
  readonly createdAt: number
  readonly keys: Array<string>
}

export interface ModelWaiter {
  readonly job: string
  leaseMs: number
  deadlineAt: number
  /**
   * The caller (the id the test gave the fired acquire_slot) waiting on this job: one at most
   * (revision 1.2: a repeat replaces the earlier request, which is answered busy at once).
   */
  readonly callers: Array<number>
}

/** A meter's usage in one period, and the thresholds already announced in it. */
export interface ModelUsage {
  readonly periodStart: number | null
  readonly used: number
  readonly announced: Array<number>
}

export interface ModelUser {
  plan: string | null
  readonly limitOverrides: Record<string, number>
  readonly usage: Record<string, ModelUsage>
  readonly holds: Array<ModelHold>
  readonly adjustments: Array<{ readonly id: string; readonly meter: string; readonly amount: number }>
  /** job -> leaseExpiresAt */
  readonly slots: Record<string, number>
  readonly waiters: Array<ModelWaiter>
  /** Every event the user's applied decisions recorded, in order (what the outbox must hold). */
  readonly events: Array<QuotaEvent>
  /**
   * The latest instant any of the user's decisions was made at. A period never goes back: while the
   * clock reads earlier (it stepped back), the period of this instant is still the current one.
   */
  latestAt: number
}

export interface ModelState {
  now: number
  readonly users: Record<string, ModelUser>
}

/** A reply the model predicts for a caller whose acquire_slot waited. */
export interface Wake {
  readonly caller: number
  readonly result: Result
}

export interface StepOutcome {
  /** "waits": an acquire_slot queued; its answer comes later as a Wake. */
  readonly result: Result | "waits"
  /** Earlier waiters this command answered (a release handing on its slot, a plan with more slots). */
  readonly wakes: Array<Wake>
}

export const initialModel = (now: number): ModelState => ({ now, users: {} })

export const periodStartOf = (period: Period, now: number): number | null => {
  if (period === "none") return null
  if (period === "day") return now - (now % dayMs)
  const date = new Date(now)
  return Date.UTC(date.getUTCFullYear(), date.getUTCMonth(), 1)
}

const userOf = (state: ModelState, user: string): ModelUser => {
  let entry = state.users[user]
  if (entry === undefined) {
    entry = {
      plan: null,
      limitOverrides: {},
      usage: {},
      holds: [],
      adjustments: [],
      slots: {},
      waiters: [],
      events: [],
      latestAt: state.now
    }
    state.users[user] = entry
  }
  return entry
}

const periodOf = (config: Config, meter: string): Period | undefined =>
  config.meters.find((entry) => entry.name === meter)?.period

const planOf = (config: Config, user: ModelUser): string => user.plan ?? config.defaultPlan

const limitOf = (config: Config, user: ModelUser, meter: string): number =>
  user.limitOverrides[meter] ?? config.plans[planOf(config, user)]?.limits[meter] ?? 0

const slotLimitOf = (config: Config, user: ModelUser): number | null =>
  config.fairness.enabled ? (config.plans[planOf(config, user)]?.slots ?? 0) : null

/**
 * The meter's usage row of the current period: an earlier period's counts as none. A period never goes
 * back (issue 19): once a decision of the user was made in a period, that period stays current while
 * the clock reads earlier (it stepped back), until the clock reaches a later one.
 */
const usageNow = (config: Config, state: ModelState, user: ModelUser, meter: string): ModelUsage => {
  const row = user.usage[meter]
  const current = periodStartOf(periodOf(config, meter) ?? "none", Math.max(state.now, user.latestAt))
  return row === undefined || row.periodStart !== current
    ? { periodStart: current, used: 0, announced: [] }
    : row
}

const usedOf = (config: Config, state: ModelState, user: ModelUser, meter: string): number =>
  usageNow(config, state, user, meter).used

const pendingOf = (user: ModelUser, meter: string): Array<ModelHold> =>
  user.holds.filter((hold) => hold.meter === meter && hold.state === "pending")

const reservedOf = (user: ModelUser, meter: string): number =>
  pendingOf(user, meter).reduce((sum, hold) => sum + Math.max(0, hold.amount - hold.consumed), 0)

/**
 * Adds `delta` to this period's usage; a refund takes it to 0 at the lowest. A change records a
 * `usage_recorded` event (revision 1.3) with what it changed; none when nothing changed.
 */
const charge = (
  config: Config,
  state: ModelState,
  user: ModelUser,
  meter: string,
  delta: number,
  source: { readonly source: "consume" | "commit" | "adjust"; readonly ref: string; readonly key?: string }
): void => {
  const row = usageNow(config, state, user, meter)
  const used = Math.max(0, row.used + delta)
  user.usage[meter] = { ...row, used }
  if (used === row.used || config.usageRecordedEvents === false) return
  user.events.push({
    event: "usage_recorded",
    at: state.now,
    meter,
    periodStart: row.periodStart,
    amount: used - row.used,
    used,
    ...source
  })
}

/** PROTOCOL.md "Configuration": a meter that lists no thresholds has [0.8, 1]. */
const thresholdsOf = (config: Config, meter: string): Array<number> =>
  [...(config.meters.find((entry) => entry.name === meter)?.thresholds ?? [0.8, 1])].sort(
    (left, right) => left - right
  )

/**
 * PROTOCOL.md "Events", `usage_threshold`: the first decision in a period after which a meter's
 * `used >= threshold x limit` announces that threshold, once per period; a limit of 0 crosses none.
 * Run after every decision of the user, on every meter: whatever the command was, only what is newly
 * true is announced, each meter's thresholds ascending.
 */
/**
 * `used >= threshold x limit` in decimals, the threshold as written in the configuration (1.1 is 11/10:
 * in binary floating point 1.1 * 50 is 55.00000000000001, which 55 would not reach).
 */
const reaches = (used: number, threshold: number, limit: number): boolean => {
  const written = String(threshold)
  if (written.includes("e")) return used >= threshold * limit
  const [whole, decimals = ""] = written.split(".")
  return BigInt(used) * 10n ** BigInt(decimals.length) >= BigInt(`${whole}${decimals}`) * BigInt(limit)
}

const announceThresholds = (config: Config, state: ModelState, user: ModelUser): void => {
  for (const { name } of config.meters) {
    const limit = limitOf(config, user, name)
    if (limit <= 0) continue
    const row = usageNow(config, state, user, name)
    for (const threshold of thresholdsOf(config, name)) {
      if (!reaches(row.used, threshold, limit) || row.announced.includes(threshold)) continue
      user.usage[name] = row
      row.announced.push(threshold)
      user.events.push({
        event: "usage_threshold",
        at: state.now,
        meter: name,
        periodStart: row.periodStart,
        threshold,
        limit,
        used: row.used
      })
    }
  }
}

const meterFields = (config: Config, state: ModelState, user: ModelUser, meter: string) => {
  const limit = limitOf(config, user, meter)
  const used = usedOf(config, state, user, meter)
  const reserved = reservedOf(user, meter)
  return {
    meter,
    limit,
    used,
    reserved,
    available: limit - used - reserved,
    overage: Math.max(0, used + reserved - limit)
  }
}

const holdReply = (
  config: Config,
  state: ModelState,
  user: ModelUser,
  status: string,
  hold: ModelHold
): Result =>
  ({
    status,
    ...meterFields(config, state, user, hold.meter),
    id: hold.id,
    amount: hold.amount,
    consumed: hold.consumed,
    state: hold.state,
    expiresAt: hold.expiresAt
  }) as Result

const invalid = (error: string): Result => ({ status: "invalid_request", error })

const slotReply = (
  config: Config,
  user: ModelUser,
  status: string,
  extra: { leaseExpiresAt?: number; retryAfterMs?: number } = {}
): Result =>
  ({
    status,
    limit: slotLimitOf(config, user),
    held: Object.keys(user.slots).length,
    ...extra
  }) as Result

const hasFreeSlot = (config: Config, user: ModelUser): boolean => {
  const limit = slotLimitOf(config, user)
  return limit === null || Object.keys(user.slots).length < limit
}

/** Hands free slots to waiters, first come first served, at `state.now`. */
const serveWaiters = (config: Config, state: ModelState, user: ModelUser, wakes: Array<Wake>): void => {
  while (user.waiters.length > 0 && hasFreeSlot(config, user)) {
    const waiter = user.waiters.shift()!
    const leaseExpiresAt = state.now + waiter.leaseMs
    user.slots[waiter.job] = leaseExpiresAt
    const result = slotReply(config, user, "acquired", { leaseExpiresAt })
    for (const caller of waiter.callers) wakes.push({ caller, result })
  }
}

/** Everything due at exactly `state.now`: holds expire, leases end (and pass to waiters), waits run out. */
const processDue = (config: Config, state: ModelState, wakes: Array<Wake>): void => {
  for (const user of Object.values(state.users)) {
    for (const hold of user.holds) {
      if (hold.state !== "pending" || hold.expiresAt > state.now) continue
      hold.state = "expired"
      user.events.push({
        event: "hold_expired",
        at: state.now,
        meter: hold.meter,
        id: hold.id,
        amount: hold.amount,
        consumed: hold.consumed,
        returned: Math.max(0, hold.amount - hold.consumed)
      })
    }
    for (const [job, leaseExpiresAt] of Object.entries(user.slots)) {
      if (leaseExpiresAt > state.now) continue
      delete user.slots[job]
      user.events.push({ event: "slot_expired", at: state.now, job, plan: planOf(config, user) })
    }
    serveWaiters(config, state, user, wakes)
    for (const waiter of [...user.waiters]) {
      if (waiter.deadlineAt > state.now) continue
      user.waiters.splice(user.waiters.indexOf(waiter), 1)
      const result = slotReply(config, user, "busy", { retryAfterMs: anyRetryAfterMs })
      for (const caller of waiter.callers) wakes.push({ caller, result })
    }
  }
}

/** The earliest moment something falls due, or null. */
export const modelNextDeadline = (state: ModelState): number | null => {
  let earliest = Infinity
  for (const user of Object.values(state.users)) {
    for (const hold of user.holds) if (hold.state === "pending") earliest = Math.min(earliest, hold.expiresAt)
    for (const leaseExpiresAt of Object.values(user.slots)) earliest = Math.min(earliest, leaseExpiresAt)
    for (const waiter of user.waiters) earliest = Math.min(earliest, waiter.deadlineAt)
  }
  return earliest === Infinity ? null : earliest
}

/** Moves the clock to `to`, processing every event on the way at its own time, in order. */
export const modelAdvanceTo = (config: Config, state: ModelState, to: number): Array<Wake> => {
  const wakes: Array<Wake> = []
  processDue(config, state, wakes)
  for (;;) {
    const next = modelNextDeadline(state)
    if (next === null || next > to) break
    state.now = Math.max(state.now, next)
    processDue(config, state, wakes)
  }
  state.now = Math.max(state.now, to)
  return wakes
}

/**
 * Sets the clock to `to`, which may be earlier (a clock that steps back): nothing falls due and nothing
 * un-expires on the way back; what falls due after `to` does when the clock reaches it again.
 */
export const modelSetClock = (state: ModelState, to: number): void => {
  state.now = to
}

/** A crash: the waiting queues were memory only, so every waiter is dropped (its callers get `unavailable`). */
export const modelCrash = (state: ModelState): Array<number> => {
  const callers: Array<number> = []
  for (const user of Object.values(state.users)) {
    for (const waiter of user.waiters.splice(0)) callers.push(...waiter.callers)
  }
  return callers
}

const decideOne = (
  config: Config,
  state: ModelState,
  command: Command,
  caller: number,
  wakes: Array<Wake>
): Result | "waits" => {
  if (
    command.user === "" &&
    (command.op === "acquire_slot" || command.op === "renew_slot" || command.op === "release_slot")
  ) {
    // A system job counts against nothing and has nothing to renew or release.
    return command.op === "acquire_slot"
      ? ({ status: "acquired", limit: null, held: 0, leaseExpiresAt: state.now + command.leaseMs } as Result)
      : ({ status: "not_found", limit: null, held: 0 } as Result)
  }
  const user = userOf(state, command.user)
  const findHold = (id: string): ModelHold | undefined => user.holds.find((hold) => hold.id === id)
  switch (command.op) {
    case "tick":
      return { status: "ok" }
    case "reserve": {
      const known = findHold(command.id)
      if (known !== undefined) {
        if (known.state !== "pending") return holdReply(config, state, user, "closed", known)
        const same = known.meter === command.meter && known.amount === command.amount
        return holdReply(config, state, user, same ? "exists" : "conflict", known)
      }
      if (periodOf(config, command.meter) === undefined) return { status: "unknown_meter" }
      const view = meterFields(config, state, user, command.meter)
      if (view.reserved + command.amount > amountMax) return invalid("amount: reserved past 2^53-1")
      if (view.used + view.reserved + command.amount > view.limit) {
        return {
          status: "insufficient_quota",
          requested: command.amount,
          pendingHolds: pendingOf(user, command.meter).length,
          ...view
        }
      }
      const hold: ModelHold = {
        id: command.id,
        meter: command.meter,
        amount: command.amount,
        consumed: 0,
        state: "pending",
        expiresAt: state.now + command.ttlMs,
        createdAt: state.now,
        keys: []
      }
      user.holds.push(hold)
      return holdReply(config, state, user, "reserved", hold)
    }
    case "consume": {
      const hold = findHold(command.id)
      if (hold === undefined) return { status: "not_found" }
      if (hold.keys.includes(command.key)) return holdReply(config, state, user, "exists", hold)
      if (hold.state !== "pending") return holdReply(config, state, user, "closed", hold)
      if (usedOf(config, state, user, hold.meter) + command.amount > amountMax) {
        return invalid("amount: used past 2^53-1")
      }
      hold.keys.push(command.key)
      hold.consumed += command.amount
      charge(config, state, user, hold.meter, command.amount, {
        source: "consume",
        ref: hold.id,
        key: command.key
      })
      return holdReply(config, state, user, "consumed", hold)
    }
    case "commit": {
      const hold = findHold(command.id)
      if (hold === undefined) return { status: "not_found" }
      if (hold.state === "committed") return holdReply(config, state, user, "exists", hold)
      if (hold.state !== "pending") return holdReply(config, state, user, "closed", hold)
      const total = command.amount ?? Math.max(hold.amount, hold.consumed)
      if (usedOf(config, state, user, hold.meter) + (total - hold.consumed) > amountMax) {
        return invalid("amount: used past 2^53-1")
      }
      charge(config, state, user, hold.meter, total - hold.consumed, { source: "commit", ref: hold.id })
      hold.consumed = total
      hold.state = "committed"
      return holdReply(config, state, user, "committed", hold)
    }
    case "release": {
      const hold = findHold(command.id)
      if (hold === undefined) return { status: "not_found" }
      if (hold.state === "released") return holdReply(config, state, user, "exists", hold)
      if (hold.state !== "pending") return holdReply(config, state, user, "closed", hold)
      hold.state = "released"
      return holdReply(config, state, user, "released", hold)
    }
    case "extend": {
      const hold = findHold(command.id)
      if (hold === undefined) return { status: "not_found" }
      if (hold.state !== "pending") return holdReply(config, state, user, "closed", hold)
      hold.expiresAt = state.now + command.ttlMs
      return holdReply(config, state, user, "extended", hold)
    }
    case "adjust": {
      const seen = user.adjustments.find((adjustment) => adjustment.id === command.id)
      if (seen !== undefined) {
        const same = seen.meter === command.meter && seen.amount === command.amount
        return {
          status: same ? "exists" : "conflict",
          id: command.id,
          ...meterFields(config, state, user, seen.meter)
        }
      }
      if (periodOf(config, command.meter) === undefined) return { status: "unknown_meter" }
      if (usedOf(config, state, user, command.meter) + command.amount > amountMax) {
        return invalid("amount: used past 2^53-1")
      }
      user.adjustments.push({ id: command.id, meter: command.meter, amount: command.amount })
      charge(config, state, user, command.meter, command.amount, { source: "adjust", ref: command.id })
      return { status: "adjusted", id: command.id, ...meterFields(config, state, user, command.meter) }
    }
    case "acquire_slot": {
      if (user.slots[command.job] !== undefined) {
        user.slots[command.job] = state.now + command.leaseMs
        return slotReply(config, user, "exists", { leaseExpiresAt: state.now + command.leaseMs })
      }
      if (user.waiters.length === 0 && hasFreeSlot(config, user)) {
        user.slots[command.job] = state.now + command.leaseMs
        return slotReply(config, user, "acquired", { leaseExpiresAt: state.now + command.leaseMs })
      }
      const queued = user.waiters.find((waiter) => waiter.job === command.job)
      if (queued !== undefined) {
        // Revision 1.2: the repeat replaces the earlier request as the waiter, with its own waitMs (and
        // leaseMs); the earlier request is answered busy at once.
        const busy = slotReply(config, user, "busy", { retryAfterMs: anyRetryAfterMs })
        for (const earlier of queued.callers.splice(0)) wakes.push({ caller: earlier, result: busy })
        if (command.waitMs === 0) {
          user.waiters.splice(user.waiters.indexOf(queued), 1)
          return busy
        }
        queued.deadlineAt = state.now + command.waitMs
        queued.leaseMs = command.leaseMs
        queued.callers.push(caller)
        return "waits"
      }
      if (command.waitMs === 0) return slotReply(config, user, "busy", { retryAfterMs: anyRetryAfterMs })
      user.waiters.push({
        job: command.job,
        leaseMs: command.leaseMs,
        deadlineAt: state.now + command.waitMs,
        callers: [caller]
      })
      return "waits"
    }
    case "renew_slot": {
      if (user.slots[command.job] === undefined) return slotReply(config, user, "not_found")
      user.slots[command.job] = state.now + command.leaseMs
      return slotReply(config, user, "renewed", { leaseExpiresAt: state.now + command.leaseMs })
    }
    case "release_slot": {
      if (user.slots[command.job] === undefined) return slotReply(config, user, "not_found")
      delete user.slots[command.job]
      const result = slotReply(config, user, "released")
      serveWaiters(config, state, user, wakes)
      return result
    }
    case "get_usage":
      return usageOf(config, state, user)
    case "usage_history":
      // The model keeps one period per meter; usage_history has tests of its own (test/billing).
      throw new Error("usage_history is not modelled")
    case "list_holds": {
      // Creation order; holds created in the same millisecond in id order (code unit order).
      const listed = user.holds
        .filter((hold) =>
          command.state === "all" ? true : (hold.state === "pending") === (command.state === "pending")
        )
        .sort(
          (left, right) =>
            left.createdAt - right.createdAt || (left.id < right.id ? -1 : left.id > right.id ? 1 : 0)
        )
      const entries = listed.slice(0, command.limit).map((hold) => ({
        id: hold.id,
        meter: hold.meter,
        amount: hold.amount,
        consumed: hold.consumed,
        state: hold.state,
        expiresAt: hold.expiresAt,
        createdAt: hold.createdAt
      }))
      // Also bounded in bytes: each entry's JSON and a comma, up to holdListReplyBytesMax.
      let bytes = 0
      const shown = entries.findIndex((entry) => {
        bytes += Buffer.byteLength(JSON.stringify(entry)) + 1
        return bytes > holdListReplyBytesMax
      })
      const holds = shown < 0 ? entries : entries.slice(0, shown)
      return { status: "ok", holds, more: listed.length > holds.length }
    }
    case "set_plan": {
      if (!Object.hasOwn(config.plans, command.plan)) return { status: "unknown_plan" }
      const previousPlan = planOf(config, user)
      user.plan = command.plan
      if (command.plan !== previousPlan) {
        user.events.push({ event: "plan_changed", at: state.now, plan: command.plan, previousPlan })
      }
      serveWaiters(config, state, user, wakes)
      return { status: "ok" }
    }
    case "set_limit": {
      if (periodOf(config, command.meter) === undefined) return { status: "unknown_meter" }
      if (command.limit === (user.limitOverrides[command.meter] ?? null)) return { status: "ok" }
      if (command.limit === null) delete user.limitOverrides[command.meter]
      else user.limitOverrides[command.meter] = command.limit
      user.events.push({ event: "limit_changed", at: state.now, meter: command.meter, limit: command.limit })
      return { status: "ok" }
    }
  }
}

const usageOf = (config: Config, state: ModelState, user: ModelUser): Result => ({
  status: "ok",
  plan: planOf(config, user),
  meters: config.meters.map(({ name, period }) => ({
    ...meterFields(config, state, user, name),
    period,
    periodStart: usageNow(config, state, user, name).periodStart,
    pendingHolds: pendingOf(user, name).length
  })),
  slots: {
    limit: slotLimitOf(config, user),
    held: Object.keys(user.slots).length,
    jobs: Object.entries(user.slots)
      .map(([job, leaseExpiresAt]) => ({ job, leaseExpiresAt }))
      .sort((left, right) => (left.job < right.job ? -1 : left.job > right.job ? 1 : 0)),
    waiting: user.waiters.length
  }
})

/**
 * Decides one command at `state.now` (updating `state`): first whatever fell due, then the command.
 * `caller` names the reply of a waiting acquire_slot in the Wakes that answer it later.
 */
export const modelStep = (config: Config, state: ModelState, command: Command, caller = -1): StepOutcome => {
  const wakes: Array<Wake> = []
  processDue(config, state, wakes)
  const result = decideOne(config, state, command, caller, wakes)
  const user = state.users[command.user]
  if (user !== undefined) {
    user.latestAt = Math.max(user.latestAt, state.now)
    announceThresholds(config, state, user)
  }
  return { result, wakes }
}

/** The events the model says `user`'s applied decisions recorded, in order. */
export const modelEvents = (state: ModelState, user: string): ReadonlyArray<QuotaEvent> =>
  state.users[user]?.events ?? []

const expiryKey = (event: QuotaEvent): string | undefined =>
  event.event === "hold_expired" ? event.id : event.event === "slot_expired" ? event.job : undefined

/**
 * Events in a comparable order. PROTOCOL.md orders events by decision, and one decision's thresholds
 * ascending; it leaves open the order of several holds (or leases) expiring in one decision, so each
 * run of such expiries at one `at` is put in id (job) order. Two decisions never make one run: the
 * first expires everything due.
 */
export const canonicalEvents = (events: ReadonlyArray<QuotaEvent>): Array<QuotaEvent> => {
  const result: Array<QuotaEvent> = []
  let run: Array<QuotaEvent> = []
  const flush = (): void => {
    run.sort((left, right) => {
      const leftKey = expiryKey(left)!
      const rightKey = expiryKey(right)!
      return leftKey < rightKey ? -1 : leftKey > rightKey ? 1 : 0
    })
    result.push(...run)
    run = []
  }
  for (const event of events) {
    const first = run[0]
    if (first !== undefined && (first.event !== event.event || first.at !== event.at)) flush()
    if (expiryKey(event) === undefined) {
      flush()
      result.push(event)
    } else run.push(event)
  }
  flush()
  return result
}

/** The statuses PROTOCOL.md allows for each operation (errors any command may get included). */
export const allowedStatuses: Record<Command["op"], ReadonlyArray<string>> = {
  reserve: [
    "reserved",
    "exists",
    "conflict",
    "closed",
    "insufficient_quota",
    "unknown_meter",
    "limit_reached"
  ],
  consume: ["consumed", "exists", "not_found", "closed", "limit_reached"],
  commit: ["committed", "exists", "closed", "not_found"],
  release: ["released", "exists", "closed", "not_found"],
  extend: ["extended", "closed", "not_found"],
  adjust: ["adjusted", "exists", "conflict", "unknown_meter"],
  acquire_slot: ["acquired", "exists", "busy", "limit_reached"],
  renew_slot: ["renewed", "not_found"],
  release_slot: ["released", "not_found"],
  get_usage: ["ok"],
  list_holds: ["ok"],
  usage_history: ["ok", "unknown_meter"],
  set_plan: ["ok", "unknown_plan"],
  set_limit: ["ok", "unknown_meter"],
  tick: ["ok"]
}

/**
 * The actual result in the model's terms: a slot result's `job` (an echo the protocol does not ask
 * for) is checked against the command and dropped; get_usage's jobs are sorted (the protocol gives no
 * order). Returns a description of what is wrong, or the normalized result.
 */
export const normalizeActual = (actual: Result, job: string | undefined): Result | string => {
  const copy: Record<string, unknown> = { ...actual }
  if ("job" in copy) {
    if (copy.job !== job) return `result echoes job ${String(copy.job)}, expected ${String(job)}`
    delete copy.job
  }
  if (actual.status === "ok" && "slots" in actual) {
    copy.slots = {
      ...actual.slots,
      jobs: [...actual.slots.jobs].sort((left, right) =>
        left.job < right.job ? -1 : left.job > right.job ? 1 : 0
      )
    }
  }
  return copy as unknown as Result
}

/**
 * Whether `actual` is what the model predicted: equal, but a predicted `busy`'s retryAfterMs stands for
 * any value in [snoozeBase, snoozeBase + jitter), and an `invalid_request` needs only some `error`.
 */
export const matchesPrediction = (config: Config, predicted: Result, actual: Result): boolean => {
  if (predicted.status === "invalid_request") {
    return actual.status === "invalid_request" && typeof actual.error === "string" && actual.error.length > 0
  }
  if ("retryAfterMs" in predicted && predicted.retryAfterMs === anyRetryAfterMs) {
    if (!("retryAfterMs" in actual) || typeof actual.retryAfterMs !== "number") return false
    const { snoozeBaseMs, snoozeJitterMs } = config.fairness
    const inRange =
      Number.isInteger(actual.retryAfterMs) &&
      actual.retryAfterMs >= snoozeBaseMs &&
      actual.retryAfterMs < snoozeBaseMs + Math.max(1, snoozeJitterMs)
    return inRange && isDeepStrictEqual({ ...actual, retryAfterMs: 0 }, { ...predicted, retryAfterMs: 0 })
  }
  return isDeepStrictEqual(actual, predicted)
}

const isDeepStrictEqual = (left: unknown, right: unknown): boolean => {
  if (Object.is(left, right)) return true
  if (typeof left !== "object" || typeof right !== "object" || left === null || right === null) return false
  if (Array.isArray(left) !== Array.isArray(right)) return false
  const leftKeys = Object.keys(left).filter((key) => (left as Record<string, unknown>)[key] !== undefined)
  const rightKeys = Object.keys(right).filter((key) => (right as Record<string, unknown>)[key] !== undefined)
  if (leftKeys.length !== rightKeys.length) return false
  return leftKeys.every((key) =>
    isDeepStrictEqual((left as Record<string, unknown>)[key], (right as Record<string, unknown>)[key])
  )
}

/** Durable rows as the model expects them, per user, for comparison with the store at the end of a run. */
export interface ExpectedRows {
  readonly plan: string | null
  readonly limits: Record<string, number>
  readonly holds: Record<
    string,
    { meter: string; amount: number; consumed: number; state: HoldState; expiresAt: number }
  >
  /** Current-period used per meter with a usage row. */
  readonly used: Record<string, number>
  readonly slots: Record<string, number>
}

export const modelExpectedRows = (config: Config, state: ModelState, user: string): ExpectedRows => {
  const entry = userOf(state, user)
  const holds: ExpectedRows["holds"] = {}
  for (const hold of entry.holds) {
    holds[hold.id] = {
      meter: hold.meter,
      amount: hold.amount,
      consumed: hold.consumed,
      state: hold.state,
      expiresAt: hold.expiresAt
    }
  }
  const used: Record<string, number> = {}
  for (const meter of Object.keys(entry.usage)) used[meter] = usedOf(config, state, entry, meter)
  return { plan: entry.plan, limits: { ...entry.limitOverrides }, holds, used, slots: { ...entry.slots } }
}
