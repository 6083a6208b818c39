/**
 * The per-user model the nemesis judges every reply against (judge.ts): from one user's calls
 * (history.ts), what its state can have been when a given call was decided. A call was decided at some
 * instant of [sentAt, repliedAt] (its retries are inside it), on the clock of whichever process
 * answered, and a serving process's clock is within B (QUOTA_CLOCK_OFFSET_MAX_MS) of Postgres's, which
 * is the world's. So the model gives bounds, not one state: what is certain before the call was sent
 * (its minimum) and what may have happened before its reply (its maximum). A reply outside them is
 * wrong, whatever interleaving of the other calls is tried. This is TigerBeetle's auditor, widened for
 * concurrency and clocks in the manner of Jepsen's checkers.
 *
 * Time, as the code promises it (SCALING.md "Clocks"): a hold expires, and a slot's lease ends, when the
 * deciding clock reaches 2B past the instant it was told. So at world time t it may have expired once
 * t >= instant + B (a clock B ahead), and has certainly expired at a decision once t >= instant + 3B
 * (a clock B behind): every decision first expires what is due. A month's end T is crossed by a
 * decision at t >= T + B certainly, and not before T - B; and a period never goes back: once a decision
 * in the new period was answered, every later one is in it too (the floor is stored with the decision).
 */
import type { Call } from "./history.js"
import { endOf, numberOf, statusOf } from "./history.js"

export interface ModelSettings {
  /** B: the most a serving process's clock is off the world's. */
  readonly clockOffsetMaxMs: number
  /** The month's end the world crosses, ms of world time (undefined: none in the run). */
  readonly monthEndAt: number | undefined
  /** The period (month start) before the month's end, when there is one. */
  readonly periodBefore: number | undefined
  readonly slotLimit: number
}

/** The window of a call's decision: from its sending to its reply (Infinity: never known). */
export interface Window {
  readonly s: number
  readonly r: number
}

export const windowOf = (call: Call): Window => ({ s: call.sentAt, r: endOf(call) })

const holdStatuses = new Set([
  "reserved",
  "exists",
  "consumed",
  "extended",
  "committed",
  "released",
  "closed"
])
/** Statuses of a call that did what it asked (or had done it in an earlier attempt). */
const applied = (call: Call): boolean =>
  ["reserved", "exists", "consumed", "extended", "committed", "released", "acquired", "renewed"].includes(
    statusOf(call)
  )
/** Did it, or may have (no reply: in flight when judged, or failed). */
const mayHaveApplied = (call: Call): boolean => call.reply === undefined || applied(call)

/** A time-setting call (reserve, extend; acquire, renew): the instant it set, as a range. */
interface Setting {
  readonly call: Call
  readonly lo: number
  readonly hi: number
}

const settingOf = (call: Call, field: string, durationMs: number, clockMs: number): Setting | undefined => {
  // A reserve answered `closed` made its hold in an earlier attempt, which then expired.
  const madeEarlier = call.op === "reserve" && statusOf(call) === "closed"
  if (!mayHaveApplied(call) && !madeEarlier) return undefined
  const exact = numberOf(call.reply, field)
  if (call.reply !== undefined && Number.isFinite(exact)) return { call, lo: exact, hi: exact }
  // Unknown: set on a clock within B of the world's, at some instant of its window.
  return { call, lo: call.sentAt - clockMs + durationMs, hi: Infinity }
}

/**
 * The instants (expiresAt, leaseExpiresAt) that can be in effect during `at`: the last one certainly
 * set before it was sent, and every one set by a call sent before its reply that may have applied.
 */
const instantsDuring = (settings: ReadonlyArray<Setting>, at: Window): { lo: number; hi: number } => {
  let base: Setting | undefined
  const candidates: Array<Setting> = []
  for (const setting of settings) {
    if (setting.call.sentAt >= at.r) continue
    if (endOf(setting.call) < at.s && setting.call.reply !== undefined) base = setting
    else candidates.push(setting)
  }
  const all =
    base === undefined ? candidates : [base, ...candidates.filter((c) => c.call.index > base.call.index)]
  if (all.length === 0) return { lo: Infinity, hi: -Infinity }
  return { lo: Math.min(...all.map((c) => c.lo)), hi: Math.max(...all.map((c) => c.hi)) }
}

/** One hold flow of the user: its reserve and every later call on its id. */
export interface HoldFlow {
  readonly id: string
  readonly amount: number
  readonly ttlMs: number
  readonly reserve: Call
  readonly calls: ReadonlyArray<Call>
}

/** One slot flow: its acquire and every later call on its job. */
export interface SlotFlow {
  readonly job: string
  readonly leaseMs: number
  readonly acquire: Call
  readonly calls: ReadonlyArray<Call>
}

export const holdFlowsOf = (calls: ReadonlyArray<Call>): Map<string, HoldFlow> => {
  const flows = new Map<string, { reserve: Call; calls: Array<Call> }>()
  for (const call of calls) {
    if (call.flow === "" || call.op.endsWith("_slot")) continue
    if (call.op === "reserve") flows.set(call.flow, { reserve: call, calls: [call] })
    else flows.get(call.flow)?.calls.push(call)
  }
  return new Map(
    [...flows].map(([id, flow]) => [
      id,
      {
        id,
        amount: Number(flow.reserve.input["amount"]),
        ttlMs: Number(flow.reserve.input["ttlMs"]),
        ...flow
      }
    ])
  )
}

export const slotFlowsOf = (calls: ReadonlyArray<Call>): Map<string, SlotFlow> => {
  const flows = new Map<string, { acquire: Call; calls: Array<Call> }>()
  for (const call of calls) {
    if (call.op === "acquire_slot") flows.set(call.flow, { acquire: call, calls: [call] })
    else if (call.op.endsWith("_slot")) flows.get(call.flow)?.calls.push(call)
  }
  return new Map(
    [...flows].map(([job, flow]) => [job, { job, leaseMs: Number(flow.acquire.input["leaseMs"]), ...flow }])
  )
}

/** What the model knows of a hold during a call's window. */
export interface HoldAt {
  /** Its reserve answered (reserved, exists, closed) before the window. */
  readonly certainlyExists: boolean
  /** Its reserve was sent before the window ended and not refused. */
  readonly possiblyExists: boolean
  /** Committed, released or expired before the decision, whatever the interleaving. */
  readonly certainlyClosed: boolean
  readonly possiblyClosed: boolean
  readonly possiblyExpired: boolean
  /** Consumed before the window (acknowledged) / possibly by its end. */
  readonly consumedMin: number
  readonly consumedMax: number
  /** The expiresAt in effect, as a range. */
  readonly expiresLo: number
  readonly expiresHi: number
}

const closedStatusOnHold = (call: Call): boolean =>
  (statusOf(call) === "closed" && call.op !== "reserve") ||
  ((call.op === "commit" || call.op === "release") && applied(call))

/**
 * `except`: a call left out, the one being judged, so that its own answer cannot excuse itself (a
 * `closed` answer is no evidence that something closed the hold before it).
 */
export const holdAt = (flow: HoldFlow, at: Window, clockMs: number, except?: Call): HoldAt => {
  const calls = except === undefined ? flow.calls : flow.calls.filter((call) => call !== except)
  const settings = calls
    .filter((call) => call.op === "reserve" || call.op === "extend")
    .flatMap((call) => settingOf(call, "expiresAt", Number(call.input["ttlMs"]), clockMs) ?? [])
  const { lo, hi } = instantsDuring(settings, at)
  const reserveStatus = statusOf(flow.reserve)
  const certainlyExists =
    endOf(flow.reserve) < at.s && ["reserved", "exists", "closed"].includes(reserveStatus)
  const possiblyExists =
    flow.reserve.sentAt < at.r && (flow.reserve.reply === undefined || holdStatuses.has(reserveStatus))
  const before = calls.filter((call) => endOf(call) < at.s)
  const sentBefore = calls.filter((call) => call.sentAt < at.r)
  const certainlyExpired = hi !== -Infinity && at.s >= hi + 3 * clockMs
  const possiblyExpired = at.r >= lo + clockMs
  const reserveClosed = reserveStatus === "closed" && endOf(flow.reserve) < at.s
  const consumes = (calls: ReadonlyArray<Call>, test: (call: Call) => boolean) =>
    calls
      .filter((call) => call.op === "consume" && test(call))
      .reduce((sum, call) => sum + Number(call.input["amount"]), 0)
  return {
    certainlyExists,
    possiblyExists,
    certainlyClosed:
      certainlyExists && (reserveClosed || before.some(closedStatusOnHold) || certainlyExpired),
    possiblyClosed:
      possiblyExpired ||
      sentBefore.some((call) => call.op === "commit" || call.op === "release" || statusOf(call) === "closed"),
    possiblyExpired,
    consumedMin: consumes(before, applied),
    consumedMax: consumes(sentBefore, mayHaveApplied),
    expiresLo: lo,
    expiresHi: hi
  }
}

/** What the model knows of a slot during a call's window. */
export interface SlotAt {
  readonly certainlyHeld: boolean
  readonly possiblyHeld: boolean
  readonly certainlyEnded: boolean
  readonly possiblyEnded: boolean
  readonly leaseLo: number
  readonly leaseHi: number
}

export const slotAt = (flow: SlotFlow, at: Window, clockMs: number, except?: Call): SlotAt => {
  const calls = except === undefined ? flow.calls : flow.calls.filter((call) => call !== except)
  const settings = calls
    .filter((call) => call.op === "acquire_slot" || call.op === "renew_slot")
    .flatMap((call) => settingOf(call, "leaseExpiresAt", Number(call.input["leaseMs"]), clockMs) ?? [])
  const { lo, hi } = instantsDuring(settings, at)
  const granted = (call: Call) => ["acquired", "exists"].includes(statusOf(call))
  const before = calls.filter((call) => endOf(call) < at.s)
  const sentBefore = calls.filter((call) => call.sentAt < at.r)
  const ended = (call: Call) =>
    (call.op === "release_slot" && statusOf(call) === "released") ||
    (call.op !== "acquire_slot" && statusOf(call) === "not_found")
  const certainlyEnded = before.some(ended) || (hi !== -Infinity && at.s >= hi + 3 * clockMs)
  const possiblyEnded =
    at.r >= lo + clockMs ||
    sentBefore.some(
      (call) => call.op === "release_slot" || (call.op === "renew_slot" && !mayHaveApplied(call))
    )
  const certainlyGranted = endOf(flow.acquire) < at.s && granted(flow.acquire)
  const possiblyGranted =
    flow.acquire.sentAt < at.r && (flow.acquire.reply === undefined || granted(flow.acquire))
  return {
    certainlyHeld: certainlyGranted && !possiblyEnded,
    possiblyHeld: possiblyGranted && !certainlyEnded,
    certainlyEnded,
    possiblyEnded,
    leaseLo: lo,
    leaseHi: hi
  }
}

/** The periods a decision in `at` can be in: the month's start before the end, after it, or either. */
export const periodsOf = (
  calls: ReadonlyArray<Call>,
  at: Window,
  settings: ModelSettings
): ReadonlyArray<"before" | "after"> => {
  const end = settings.monthEndAt
  if (end === undefined) return ["before"]
  const clockMs = settings.clockOffsetMaxMs
  // A decision of the new period answered before this one was sent: the floor holds it there.
  const floorAfter = calls.some(
    (call) =>
      call.reply !== undefined &&
      endOf(call) < at.s &&
      (call.sentAt >= end + clockMs || newPeriodShown(call, settings))
  )
  if (floorAfter || at.s >= end + clockMs) return ["after"]
  if (at.r < end - clockMs) return ["before"]
  return ["before", "after"]
}

/** A get_usage that showed the new period (its floor is stored: no later decision goes back). */
const newPeriodShown = (call: Call, settings: ModelSettings): boolean => {
  if (call.op !== "get_usage" || settings.monthEndAt === undefined) return false
  const meters = call.reply?.["meters"]
  return (
    Array.isArray(meters) &&
    meters.some((meter: { periodStart?: number | null }) => (meter.periodStart ?? -1) >= settings.monthEndAt!)
  )
}

/** A change of `used` (a consume or a commit's charge): how much, and whether it counted. */
interface Change {
  readonly call: Call
  readonly delta: number
}

/** The user's changes of `used`: every consume, and every commit's charge beyond what was consumed. */
export const changesOf = (flows: ReadonlyMap<string, HoldFlow>): Array<Change> => {
  const changes: Array<Change> = []
  for (const flow of flows.values()) {
    let consumed = 0
    for (const call of flow.calls) {
      if (call.op === "consume") {
        changes.push({ call, delta: Number(call.input["amount"]) })
        if (applied(call)) consumed += Number(call.input["amount"])
      } else if (call.op === "commit") changes.push({ call, delta: Number(call.input["amount"]) - consumed })
    }
  }
  return changes
}

/** `used` in a period during `at`: the changes certainly counted in it before, and those that may be. */
export const usedBounds = (
  calls: ReadonlyArray<Call>,
  changes: ReadonlyArray<Change>,
  at: Window,
  period: "before" | "after",
  settings: ModelSettings
): { min: number; max: number } => {
  let min = 0
  let max = 0
  for (const change of changes) {
    const own = windowOf(change.call)
    const periods = periodsOf(calls, own, settings)
    if (!periods.includes(period)) continue
    if (endOf(change.call) < at.s && applied(change.call) && periods.length === 1) min += change.delta
    if (change.call.sentAt < at.r && mayHaveApplied(change.call)) max += change.delta
  }
  return { min, max }
}

/** `reserved` and the pending holds' count during `at`, as bounds. */
export const reservedBounds = (flows: ReadonlyMap<string, HoldFlow>, at: Window, clockMs: number) => {
  const bounds = { reservedMin: 0, reservedMax: 0, pendingMin: 0, pendingMax: 0 }
  for (const flow of flows.values()) {
    const hold = holdAt(flow, at, clockMs)
    if (hold.certainlyExists && !hold.possiblyClosed) {
      bounds.reservedMin += Math.max(0, flow.amount - hold.consumedMax)
      bounds.pendingMin += 1
    }
    if (hold.possiblyExists && !hold.certainlyClosed) {
      bounds.reservedMax += Math.max(0, flow.amount - hold.consumedMin)
      bounds.pendingMax += 1
    }
  }
  return bounds
}
