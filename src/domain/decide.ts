/**
 * The decision function: (state, command, context) -> { state, events, result, wakeups }.
 * No IO, no clock, no randomness but what the context injects. The actor loads, decides, persists, replies.
 */
import type { Command } from "./commands.js"
import type { DecideContext, Output, ReplyHandle, Wakeup } from "./context.js"
import { noReplyHandle } from "./context.js"
import type { StoreEvent } from "./events.js"
import { adjust, commit, consume, expireHolds, extend, pruneRemembered, release, reserve } from "./holds.js"
import { listHolds } from "./holdList.js"
import { usageHistory } from "./usageHistory.js"
import { assertUserState } from "./invariants.js"
import type { Result } from "./results.js"
import { unknownMeter } from "./results.js"
import { acquireSlot, decideSystemJob, expireSlots, grantWaiters, releaseSlot, renewSlot } from "./slots.js"
import type { UserState } from "./state.js"
import { advancePeriodFloor, planOf, usageView } from "./state.js"
import { announceThresholds, pushUsageRow } from "./thresholds.js"
import { meterPeriod, planNamed } from "./config.js"

export interface Decision {
  readonly state: UserState
  /** What the store must make durable before `result` and `wakeups` are sent. */
  readonly events: ReadonlyArray<StoreEvent>
  /** null: nothing to answer now (a tick, or an `acquire_slot` that waits; it is answered by a wakeup). */
  readonly result: Result | null
  readonly wakeups: ReadonlyArray<Wakeup>
}

export interface DecideOptions {
  /** Recount every aggregate after the decision (O(holds)); tests turn it on. */
  readonly assertFull?: boolean
}

/** Everything due at ctx.now: hold expiry, lease end, waiter timeout, forgetting ids past retention. */
const advance = (ctx: DecideContext, state: UserState, output: Output): void => {
  expireHolds(ctx, state, output)
  expireSlots(ctx, state, output)
  pruneRemembered(ctx, state)
}

const decideCommand = (
  ctx: DecideContext,
  state: UserState,
  command: Command,
  output: Output,
  reply: ReplyHandle
): Result | null => {
  switch (command.op) {
    case "tick":
      return null
    case "reserve":
      return reserve(ctx, state, command, output)
    case "consume":
      return consume(ctx, state, command, output)
    case "commit":
      return commit(ctx, state, command, output)
    case "release":
      return release(ctx, state, command, output)
    case "extend":
      return extend(ctx, state, command, output)
    case "adjust":
      return adjust(ctx, state, command, output)
    case "acquire_slot":
      return command.user === ""
        ? decideSystemJob(command, ctx.now)
        : acquireSlot(ctx, state, command, output, reply)
    case "renew_slot":
      return command.user === "" ? decideSystemJob(command, ctx.now) : renewSlot(ctx, state, command, output)
    case "release_slot":
      return command.user === ""
        ? decideSystemJob(command, ctx.now)
        : releaseSlot(ctx, state, command, output)
    case "get_usage":
      return usageView(ctx.config, state, ctx.now)
    case "list_holds":
      return listHolds(state, command)
    case "usage_history":
      return usageHistory(ctx, state, command)
    case "set_plan": {
      if (planNamed(ctx.config, command.plan) === undefined) return { status: "unknown_plan" }
      const previousPlan = planOf(ctx.config, state)
      state.plan = command.plan
      // Written even when it names the plan in effect: it pins the user to it should defaultPlan change.
      output.events.push({ kind: "plan", user: state.user, plan: command.plan })
      if (previousPlan === command.plan) return { status: "ok" }
      output.events.push({
        kind: "event",
        user: state.user,
        event: { event: "plan_changed", at: ctx.now, plan: command.plan, previousPlan }
      })
      // The new plan's limits may be lower: announce what they make `used` cross.
      for (const { name } of ctx.config.meters) {
        if (announceThresholds(ctx, state, name, output)) pushUsageRow(ctx, state, name, output)
      }
      // A plan with more slots serves the queue at once.
      grantWaiters(ctx, state, output)
      return { status: "ok" }
    }
    case "set_limit": {
      if (meterPeriod(ctx.config, command.meter) === undefined) return unknownMeter
      const previous = state.limitOverrides?.get(command.meter) ?? null
      // Setting the override already stored changes nothing: nothing to write or announce.
      if (previous === command.limit) return { status: "ok" }
      if (command.limit === null) state.limitOverrides?.delete(command.meter)
      else (state.limitOverrides ??= new Map()).set(command.meter, command.limit)
      output.events.push({ kind: "limit", user: state.user, meter: command.meter, limit: command.limit })
      output.events.push({
        kind: "event",
        user: state.user,
        event: { event: "limit_changed", at: ctx.now, meter: command.meter, limit: command.limit }
      })
      if (announceThresholds(ctx, state, command.meter, output))
        pushUsageRow(ctx, state, command.meter, output)
      return { status: "ok" }
    }
  }
}

export const decide = (
  state: UserState,
  command: Command,
  ctx: DecideContext,
  options: DecideOptions = {},
  reply: ReplyHandle = noReplyHandle()
): Decision => {
  const output: Output = { events: [], wakeups: [] }
  const result = decideInto(state, command, ctx, output, options, reply)
  return { state, events: output.events, result, wakeups: output.wakeups }
}

/**
 * `decide`, appending the events and wakeups to `output` (a partition's batch collects a whole batch's
 * there) and returning the result: nothing allocated for the decision itself. `reply` is the caller's
 * handle: an `acquire_slot` that waits keeps it with its waiter, and its wakeup hands it back.
 */
export const decideInto = (
  state: UserState,
  command: Command,
  ctx: DecideContext,
  output: Output,
  options: DecideOptions = {},
  reply: ReplyHandle = noReplyHandle()
): Result | null => {
  advancePeriodFloor(state, ctx.now)
  advance(ctx, state, output)
  const result = decideCommand(ctx, state, command, output, reply)
  if (options.assertFull === true) assertUserState(state)
  return result
}
