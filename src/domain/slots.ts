/**
 * Fairness slots: acquire (with a FIFO wait), renew, release, lease expiry and waiter timeout.
 * A waiting `acquire_slot` decides to `null`: its answer comes later as a Wakeup for its job.
 */
import type { OpsCommand } from "./commands.js"
import { clockSkewMaxMs } from "./config.js"
import type { DecideContext, Output, ReplyHandle } from "./context.js"
import { assertSlotsWithinLimit } from "./invariants.js"
import { slotWaitersPerUserMax, slotsPerUserMax } from "./limits.js"
import type { LimitReachedResult, SlotResult } from "./results.js"
import { limitReached } from "./results.js"
import type { UserState } from "./state.js"
import { planOf, releaseIfEmpty, slotLimit, writable, writableWaiters } from "./state.js"

type CommandOf<Op extends OpsCommand["op"]> = Extract<OpsCommand, { op: Op }>

const slotResult = (
  ctx: DecideContext,
  state: UserState,
  status: SlotResult["status"],
  extra: Partial<Pick<SlotResult, "job" | "leaseExpiresAt" | "retryAfterMs">> = {}
): SlotResult => ({ status, limit: slotLimit(ctx.config, state), held: state.slots.size, ...extra })

/** `retryAfterMs` of a `busy`: the snooze base plus jitter, so snoozed callers do not return together. */
export const busyResult = (ctx: DecideContext, state: UserState): SlotResult =>
  slotResult(ctx, state, "busy", {
    retryAfterMs:
      ctx.config.fairness.snoozeBaseMs + Math.floor(ctx.random() * ctx.config.fairness.snoozeJitterMs)
  })

/** A slot is free under the plan's limit (none with fairness off) and the per-user bound. */
const hasFreeSlot = (ctx: DecideContext, state: UserState): boolean => {
  if (state.slots.size >= slotsPerUserMax) return false
  const limit = slotLimit(ctx.config, state)
  return limit === null || state.slots.size < limit
}

/** Takes a job's slot away; with none left, the lease bound is exact again (none due). */
const forgetSlot = (state: UserState, job: string): void => {
  writable(state, "slots").delete(job)
  if (state.slots.size === 0) state.slotsLeaseExpiresAtLowest = Infinity
  releaseIfEmpty(state, "slots")
}

const grant = (
  ctx: DecideContext,
  state: UserState,
  job: string,
  leaseMs: number,
  output: Output
): number => {
  const leaseExpiresAt = ctx.now + leaseMs
  writable(state, "slots").set(job, leaseExpiresAt)
  state.slotsLeaseExpiresAtLowest = Math.min(state.slotsLeaseExpiresAtLowest, leaseExpiresAt)
  output.events.push({ kind: "slot", user: state.user, job, leaseExpiresAt })
  return leaseExpiresAt
}

/** A system job (empty user) is always acquired and counts against nothing; it has no state to renew or release. */
export const decideSystemJob = (
  command: CommandOf<"acquire_slot" | "renew_slot" | "release_slot">,
  now: number
): SlotResult =>
  command.op === "acquire_slot"
    ? { status: "acquired", limit: null, held: 0, job: command.job, leaseExpiresAt: now + command.leaseMs }
    : { status: "not_found", limit: null, held: 0 }

/**
 * Returns null when the caller waits in the queue. A repeat of a job that is waiting replaces the
 * earlier request as the waiter (PROTOCOL.md revision 1.2): the earlier one is woken `busy` now, and the
 * job keeps its place in the queue with the repeat's own waitMs and leaseMs. So the queue holds at most
 * one request per job, whatever a caller sends (copies each parked kept every message alive).
 */
export const acquireSlot = (
  ctx: DecideContext,
  state: UserState,
  command: CommandOf<"acquire_slot">,
  output: Output,
  reply: ReplyHandle
): SlotResult | LimitReachedResult | null => {
  if (state.slots.has(command.job)) {
    const leaseExpiresAt = grant(ctx, state, command.job, command.leaseMs, output)
    return slotResult(ctx, state, "exists", { job: command.job, leaseExpiresAt })
  }
  // A new slot past the per-user bound (only reachable with fairness off, or a plan above it).
  if (state.slots.size >= slotsPerUserMax) return limitReached("slots", slotsPerUserMax)
  // Waiters are served first: a newcomer does not jump the FIFO queue.
  if (hasFreeSlot(ctx, state) && state.waiters.length === 0) {
    const leaseExpiresAt = grant(ctx, state, command.job, command.leaseMs, output)
    assertSlotsWithinLimit(state, slotLimit(ctx.config, state))
    return slotResult(ctx, state, "acquired", { job: command.job, leaseExpiresAt })
  }
  const queuedAt = state.waiters.findIndex((waiter) => waiter.job === command.job)
  if (queuedAt !== -1) {
    const waiters = writableWaiters(state)
    output.wakeups.push({ job: command.job, reply: waiters[queuedAt]!.reply, result: busyResult(ctx, state) })
    // waitMs 0: the repeat does not wait, so the job leaves the queue.
    if (command.waitMs === 0) {
      waiters.splice(queuedAt, 1)
      return busyResult(ctx, state)
    }
    waiters[queuedAt] = {
      job: command.job,
      leaseMs: command.leaseMs,
      deadlineAt: ctx.now + command.waitMs,
      reply
    }
    return null
  }
  if (command.waitMs === 0) return busyResult(ctx, state)
  if (state.waiters.length >= slotWaitersPerUserMax)
    return limitReached("slot_waiters", slotWaitersPerUserMax)
  writableWaiters(state).push({
    job: command.job,
    leaseMs: command.leaseMs,
    deadlineAt: ctx.now + command.waitMs,
    reply
  })
  return null
}

export const renewSlot = (
  ctx: DecideContext,
  state: UserState,
  command: CommandOf<"renew_slot">,
  output: Output
): SlotResult => {
  if (!state.slots.has(command.job)) return slotResult(ctx, state, "not_found")
  const leaseExpiresAt = grant(ctx, state, command.job, command.leaseMs, output)
  return slotResult(ctx, state, "renewed", { job: command.job, leaseExpiresAt })
}

export const releaseSlot = (
  ctx: DecideContext,
  state: UserState,
  command: CommandOf<"release_slot">,
  output: Output
): SlotResult => {
  if (!state.slots.has(command.job)) return slotResult(ctx, state, "not_found")
  forgetSlot(state, command.job)
  output.events.push({ kind: "slot_freed", user: state.user, job: command.job, reason: "released" })
  const result = slotResult(ctx, state, "released", { job: command.job })
  grantWaiters(ctx, state, output)
  return result
}

/** Hands free slots to waiters in FIFO order. */
export const grantWaiters = (ctx: DecideContext, state: UserState, output: Output): void => {
  while (state.waiters.length > 0 && hasFreeSlot(ctx, state)) {
    const waiter = writableWaiters(state).shift()!
    const status = state.slots.has(waiter.job) ? "exists" : "acquired"
    const leaseExpiresAt = grant(ctx, state, waiter.job, waiter.leaseMs, output)
    assertSlotsWithinLimit(state, slotLimit(ctx.config, state))
    output.wakeups.push({
      job: waiter.job,
      reply: waiter.reply,
      result: slotResult(ctx, state, status, { job: waiter.job, leaseExpiresAt })
    })
  }
}

/**
 * Frees leases that ended, gives the slots to waiters, then times out waiters whose wait ran out. The
 * slots are walked only when the lease bound says one may be due (then the bound is made exact), not
 * on every decision: with fairness off a user may hold a thousand slots.
 *
 * A lease ends clockSkewMaxMs after its `leaseExpiresAt`: that instant was read on the clock of the
 * process that granted or renewed it, and the process deciding now (a new owner) may run ahead of it
 * by up to that much. Freed on time or late, never early, so a user never holds more than its plan.
 */
export const expireSlots = (ctx: DecideContext, state: UserState, output: Output): void => {
  if (state.slotsLeaseExpiresAtLowest + clockSkewMaxMs(ctx.config) <= ctx.now)
    expireLeases(ctx, state, output)
  grantWaiters(ctx, state, output)
  for (let index = 0; index < state.waiters.length;) {
    const waiter = state.waiters[index]!
    if (waiter.deadlineAt > ctx.now) {
      index += 1
      continue
    }
    writableWaiters(state).splice(index, 1)
    output.wakeups.push({ job: waiter.job, reply: waiter.reply, result: busyResult(ctx, state) })
  }
}

/** Frees every lease due at ctx.now, and sets the lease bound to the exact earliest of the rest. */
const expireLeases = (ctx: DecideContext, state: UserState, output: Output): void => {
  const due: Array<string> = []
  let lowest = Infinity
  const skewMs = clockSkewMaxMs(ctx.config)
  for (const [job, leaseExpiresAt] of state.slots) {
    if (leaseExpiresAt + skewMs <= ctx.now) due.push(job)
    else lowest = Math.min(lowest, leaseExpiresAt)
  }
  state.slotsLeaseExpiresAtLowest = lowest
  for (const job of due) {
    forgetSlot(state, job)
    output.events.push({ kind: "slot_freed", user: state.user, job, reason: "expired" })
    output.events.push({
      kind: "event",
      user: state.user,
      event: { event: "slot_expired", at: ctx.now, job, plan: planOf(ctx.config, state) }
    })
  }
}
