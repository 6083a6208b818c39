/**
 * Holds and usage: reserve, consume, commit, release, extend, adjust, and hold expiry.
 * Every function decides one command against the state at ctx.now, updating the state in place and
 * appending to `output` the events the store must make durable before the result is sent.
 */
import type { OpsCommand } from "./commands.js"
import type { DecideContext, Output } from "./context.js"
import { clockSkewMaxMs, meterPeriod } from "./config.js"
import { assertGrantWithinLimit, assertMeter } from "./invariants.js"
import {
  amountMax,
  adjustIdsPerUserMax,
  closedHoldsPerUserMax,
  consumeKeysPerHoldMax,
  idRetentionMs,
  pendingHoldsPerUserMax
} from "./limits.js"
import type { AdjustResult, HoldResult, HoldStatus, Result } from "./results.js"
import { invalidRequest, limitReached, notFound, unknownMeter } from "./results.js"
import type { Hold, UserState } from "./state.js"
import { announceThresholds, pushUsageRow } from "./thresholds.js"
import {
  forgetOldestClosed,
  forgetPending,
  holdRecord,
  holdReserved,
  meterAt,
  meterLimit,
  meterView,
  rememberClosed,
  rememberPending,
  writable
} from "./state.js"

type CommandOf<Op extends OpsCommand["op"]> = Extract<OpsCommand, { op: Op }>

/**
 * Built for nearly every command: its fields copied into one object of one shape rather than spread
 * from the meter's view and the hold's (what a command allocates is what the young generation collects).
 */
const holdResult = (ctx: DecideContext, state: UserState, status: HoldStatus, hold: Hold): HoldResult => {
  const meter = meterView(ctx.config, state, hold.meter, ctx.now)
  return {
    status,
    meter: meter.meter,
    limit: meter.limit,
    used: meter.used,
    reserved: meter.reserved,
    available: meter.available,
    overage: meter.overage,
    id: hold.id,
    amount: hold.amount,
    consumed: hold.consumed,
    state: hold.state,
    expiresAt: hold.expiresAt
  }
}

const findHold = (state: UserState, id: string): Hold | undefined =>
  state.pending.get(id) ?? state.closed.get(id)

const wouldOverflow = (base: number, amount: number): boolean => base + amount > amountMax

/** Records a change of `used` in the ledger and the running total. `delta` is what was applied. */
const recordUsage = (
  ctx: DecideContext,
  state: UserState,
  output: Output,
  entry: {
    meter: string
    operation: "consume" | "commit" | "adjust"
    holdId: string | null
    key: string
    requested: number
    delta: number
  }
): void => {
  const meterState = meterAt(ctx.config, state, entry.meter, ctx.now)
  meterState.used += entry.delta
  output.events.push({
    kind: "ledger",
    user: state.user,
    meter: entry.meter,
    periodStart: meterState.periodStart,
    operation: entry.operation,
    holdId: entry.holdId,
    key: entry.key,
    requested: entry.requested,
    delta: entry.delta,
    at: ctx.now
  })
  // Revision 1.3: per user, meter and period the amounts add up to `used`; a change of 0 records none.
  if (entry.delta !== 0 && ctx.config.usageRecordedEvents !== false) {
    output.events.push({
      kind: "event",
      user: state.user,
      event: {
        event: "usage_recorded",
        at: ctx.now,
        meter: entry.meter,
        periodStart: meterState.periodStart,
        amount: entry.delta,
        used: meterState.used,
        source: entry.operation,
        ref: entry.holdId ?? entry.key,
        ...(entry.operation === "consume" ? { key: entry.key } : {})
      }
    })
  }
  if (entry.delta > 0) announceThresholds(ctx, state, entry.meter, output)
  pushUsageRow(ctx, state, entry.meter, output)
}

/** A refund applies at most what is used: usage never goes below 0. */
const refundDelta = (used: number, refund: number): number => -Math.min(used, refund)

/** Moves a pending hold to a closed state, returning its unconsumed rest to the meter. */
const closeHold = (
  ctx: DecideContext,
  state: UserState,
  hold: Hold,
  closedState: "committed" | "released" | "expired"
): void => {
  const meterState = meterAt(ctx.config, state, hold.meter, ctx.now)
  meterState.reserved -= holdReserved(hold)
  meterState.pendingHolds -= 1
  hold.state = closedState
  hold.closedAt = ctx.now
  forgetPending(state, hold)
  rememberClosed(state, hold)
  while (state.closed.size > closedHoldsPerUserMax) {
    forgetOldestClosed(state)
    state.idsForgotten = true
  }
}

const pushHold = (state: UserState, output: Output, hold: Hold): void => {
  output.events.push({ kind: "hold", user: state.user, hold: holdRecord(hold) })
}

export const reserve = (
  ctx: DecideContext,
  state: UserState,
  command: CommandOf<"reserve">,
  output: Output
): Result => {
  const pendingHold = state.pending.get(command.id)
  if (pendingHold !== undefined) {
    const same = pendingHold.meter === command.meter && pendingHold.amount === command.amount
    return holdResult(ctx, state, same ? "exists" : "conflict", pendingHold)
  }
  const closedHold = state.closed.get(command.id)
  if (closedHold !== undefined) return holdResult(ctx, state, "closed", closedHold)
  if (meterPeriod(ctx.config, command.meter) === undefined) return unknownMeter
  if (state.pending.size >= pendingHoldsPerUserMax)
    return limitReached("pending_holds", pendingHoldsPerUserMax)

  const meterState = meterAt(ctx.config, state, command.meter, ctx.now)
  // PROTOCOL.md: past 2^53-1 for `used` or `reserved` is invalid; their sum is only ever compared to a limit.
  if (wouldOverflow(meterState.reserved, command.amount)) {
    return invalidRequest("amount: would take the meter's reserved past 2^53-1")
  }
  const limit = meterLimit(ctx.config, state, command.meter)
  if (meterState.used + meterState.reserved + command.amount > limit) {
    return {
      status: "insufficient_quota",
      requested: command.amount,
      pendingHolds: meterState.pendingHolds,
      ...meterView(ctx.config, state, command.meter, ctx.now)
    }
  }
  const hold: Hold = {
    id: command.id,
    meter: command.meter,
    amount: command.amount,
    consumed: 0,
    state: "pending",
    expiresAt: ctx.now + command.ttlMs,
    createdAt: ctx.now,
    closedAt: null,
    consumeKeys: null,
    closedNext: null
  }
  rememberPending(state, hold)
  meterState.reserved += hold.amount
  meterState.pendingHolds += 1
  assertGrantWithinLimit(state, hold.meter, limit)
  assertMeter(state, hold.meter)
  pushHold(state, output, hold)
  return holdResult(ctx, state, "reserved", hold)
}

export const consume = (
  ctx: DecideContext,
  state: UserState,
  command: CommandOf<"consume">,
  output: Output
): Result => {
  const hold = findHold(state, command.id)
  if (hold === undefined) return notFound
  if (hold.consumeKeys?.has(command.key) === true) return holdResult(ctx, state, "exists", hold)
  if (hold.state !== "pending") return holdResult(ctx, state, "closed", hold)
  if ((hold.consumeKeys?.size ?? 0) >= consumeKeysPerHoldMax) {
    return limitReached("consume_keys", consumeKeysPerHoldMax)
  }
  const meterState = meterAt(ctx.config, state, hold.meter, ctx.now)
  if (wouldOverflow(meterState.used, command.amount) || wouldOverflow(hold.consumed, command.amount)) {
    return invalidRequest("amount: would take the meter's used past 2^53-1")
  }
  const reservedBefore = holdReserved(hold)
  hold.consumed += command.amount
  hold.consumeKeys ??= new Set()
  hold.consumeKeys.add(command.key)
  meterState.reserved += holdReserved(hold) - reservedBefore
  pushHold(state, output, hold)
  recordUsage(ctx, state, output, {
    meter: hold.meter,
    operation: "consume",
    holdId: hold.id,
    key: command.key,
    requested: command.amount,
    delta: command.amount
  })
  assertMeter(state, hold.meter)
  return holdResult(ctx, state, "consumed", hold)
}

export const commit = (
  ctx: DecideContext,
  state: UserState,
  command: CommandOf<"commit">,
  output: Output
): Result => {
  const hold = findHold(state, command.id)
  if (hold === undefined) return notFound
  if (hold.state === "committed") return holdResult(ctx, state, "exists", hold)
  if (hold.state !== "pending") return holdResult(ctx, state, "closed", hold)
  const finalUsage = command.amount ?? Math.max(hold.amount, hold.consumed)
  const meterState = meterAt(ctx.config, state, hold.meter, ctx.now)
  const charge = finalUsage - hold.consumed
  if (charge > 0 && wouldOverflow(meterState.used, charge)) {
    return invalidRequest("amount: would take the meter's used past 2^53-1")
  }
  const delta = charge >= 0 ? charge : refundDelta(meterState.used, -charge)
  closeHold(ctx, state, hold, "committed")
  hold.consumed = finalUsage
  pushHold(state, output, hold)
  recordUsage(ctx, state, output, {
    meter: hold.meter,
    operation: "commit",
    holdId: hold.id,
    key: "",
    requested: finalUsage,
    delta
  })
  assertMeter(state, hold.meter)
  return holdResult(ctx, state, "committed", hold)
}

export const release = (
  ctx: DecideContext,
  state: UserState,
  command: CommandOf<"release">,
  output: Output
): Result => {
  const hold = findHold(state, command.id)
  if (hold === undefined) return notFound
  if (hold.state === "released") return holdResult(ctx, state, "exists", hold)
  if (hold.state !== "pending") return holdResult(ctx, state, "closed", hold)
  closeHold(ctx, state, hold, "released")
  pushHold(state, output, hold)
  assertMeter(state, hold.meter)
  return holdResult(ctx, state, "released", hold)
}

export const extend = (
  ctx: DecideContext,
  state: UserState,
  command: CommandOf<"extend">,
  output: Output
): Result => {
  const hold = findHold(state, command.id)
  if (hold === undefined) return notFound
  if (hold.state !== "pending") return holdResult(ctx, state, "closed", hold)
  hold.expiresAt = ctx.now + command.ttlMs
  state.pendingExpiresAtLowest = Math.min(state.pendingExpiresAtLowest, hold.expiresAt)
  pushHold(state, output, hold)
  return holdResult(ctx, state, "extended", hold)
}

export const adjust = (
  ctx: DecideContext,
  state: UserState,
  command: CommandOf<"adjust">,
  output: Output
): Result => {
  const seen = state.adjustments.get(command.id)
  if (seen !== undefined) {
    const same = seen.meter === command.meter && seen.amount === command.amount
    const result: AdjustResult = {
      status: same ? "exists" : "conflict",
      id: command.id,
      ...meterView(ctx.config, state, seen.meter, ctx.now)
    }
    return result
  }
  if (meterPeriod(ctx.config, command.meter) === undefined) return unknownMeter
  const meterState = meterAt(ctx.config, state, command.meter, ctx.now)
  if (command.amount > 0 && wouldOverflow(meterState.used, command.amount)) {
    return invalidRequest("amount: would take the meter's used past 2^53-1")
  }
  const delta = command.amount >= 0 ? command.amount : refundDelta(meterState.used, -command.amount)
  const adjustments = writable(state, "adjustments")
  adjustments.set(command.id, { meter: command.meter, amount: command.amount, at: ctx.now })
  while (adjustments.size > adjustIdsPerUserMax) {
    const oldest = adjustments.keys().next().value
    if (oldest === undefined) break
    adjustments.delete(oldest)
    state.idsForgotten = true
  }
  recordUsage(ctx, state, output, {
    meter: command.meter,
    operation: "adjust",
    holdId: null,
    key: command.id,
    requested: command.amount,
    delta
  })
  assertMeter(state, command.meter)
  const result: AdjustResult = {
    status: "adjusted",
    id: command.id,
    ...meterView(ctx.config, state, command.meter, ctx.now)
  }
  return result
}

/**
 * Expires every pending hold due at ctx.now, exactly once: an expired hold is closed and never pending
 * again, and announced (`hold_expired`, an orphan: its work never committed or released it). Due means
 * clockSkewMaxMs past `expiresAt`, which was read on the clock of the process that reserved or extended
 * it: a process whose clock runs ahead of that one (a new owner) must not return the reservation while
 * its work may still commit within its time, and grant it again.
 */
export const expireHolds = (ctx: DecideContext, state: UserState, output: Output): void => {
  const skewMs = clockSkewMaxMs(ctx.config)
  if (state.pendingExpiresAtLowest + skewMs > ctx.now) return
  // Something may be due: collect what is, and the exact earliest of the rest, in one pass.
  const due: Array<Hold> = []
  let lowest = Infinity
  for (const hold of state.pending.values()) {
    if (hold.expiresAt + skewMs <= ctx.now) due.push(hold)
    else lowest = Math.min(lowest, hold.expiresAt)
  }
  state.pendingExpiresAtLowest = lowest
  for (const hold of due) {
    const returned = holdReserved(hold)
    closeHold(ctx, state, hold, "expired")
    pushHold(state, output, hold)
    output.events.push({
      kind: "event",
      user: state.user,
      event: {
        event: "hold_expired",
        at: ctx.now,
        meter: hold.meter,
        id: hold.id,
        amount: hold.amount,
        consumed: hold.consumed,
        returned
      }
    })
    assertMeter(state, hold.meter)
  }
}

/**
 * Forgets closed holds and adjust ids past the retention window, oldest first, stopping at the first
 * still inside it. Both are kept in the order they were decided, which is time order unless the clock
 * stepped back; then some are kept a little past their window, none is forgotten before it ends.
 */
export const pruneRemembered = (ctx: DecideContext, state: UserState): void => {
  const cutoff = ctx.now - idRetentionMs
  // Deletes only what is there, so an untouched sentinel is never written.
  while (state.closedOldest !== null && (state.closedOldest.closedAt ?? 0) < cutoff) forgetOldestClosed(state)
  for (const [id, adjustment] of state.adjustments) {
    if (adjustment.at >= cutoff) break
    writable(state, "adjustments").delete(id)
  }
}
