/**
 * One user as the judge sees it (judge.ts, judgeReads.ts): its calls, holds, slots and changes of
 * `used` from the model (model.ts), and the check of the figures a reply shows against the model's
 * bounds.
 */
import type { Call } from "./history.js"
import { statusOf } from "./history.js"
import type { HoldFlow, ModelSettings, SlotFlow, Window } from "./model.js"
import { changesOf, holdFlowsOf, periodsOf, reservedBounds, slotFlowsOf, usedBounds } from "./model.js"

export interface UserView {
  readonly calls: ReadonlyArray<Call>
  readonly holds: ReadonlyMap<string, HoldFlow>
  readonly slots: ReadonlyMap<string, SlotFlow>
  readonly changes: ReturnType<typeof changesOf>
  /** The limit set_limit acknowledged for a hold user (undefined: a slot user, on its plan). */
  readonly limit: number | undefined
  readonly settings: ModelSettings
}

export const userView = (calls: ReadonlyArray<Call>, settings: ModelSettings): UserView => {
  const holds = holdFlowsOf(calls)
  const limitCall = calls.find((call) => call.op === "set_limit" && statusOf(call) === "ok")
  return {
    calls,
    holds,
    slots: slotFlowsOf(calls),
    changes: changesOf(holds),
    limit: limitCall === undefined ? undefined : Number(limitCall.input["limit"]),
    settings
  }
}

export const within = (name: string, value: number, min: number, max: number): Array<string> =>
  value >= min && value <= max ? [] : [`${name} ${value}, the model allows ${min}..${max}`]

export /**
 * `used` within what the user's changes allow in the decision's period (either, when its window
 * straddles the month's end and no period is shown), `reserved` and the pending count within the
 * holds'. A grant's own hold counts in its reply.
 */
const judgeUsedReserved = (
  used: number,
  reserved: number,
  pending: number | undefined,
  view: UserView,
  at: Window,
  /** The hold a reserve answered `reserved` or `exists` granted: pending in its own reply. */
  own: HoldFlow | undefined,
  shownPeriod?: "before" | "after"
): Array<string> => {
  const clockMs = view.settings.clockOffsetMaxMs
  const periods = shownPeriod === undefined ? periodsOf(view.calls, at, view.settings) : [shownPeriod]
  const useds = periods.map((period) => usedBounds(view.calls, view.changes, at, period, view.settings))
  const bounds = reservedBounds(view.holds, at, clockMs)
  const ownReserved = own === undefined ? 0 : own.amount
  return [
    ...within(
      view.settings.monthEndAt === undefined ? "used" : `used (${periods.join(" or ")} the month's end)`,
      used,
      Math.min(...useds.map((bound) => bound.min)),
      Math.max(...useds.map((bound) => bound.max))
    ),
    ...within("reserved", reserved, bounds.reservedMin + ownReserved, bounds.reservedMax),
    ...(pending === undefined
      ? []
      : within("pendingHolds", pending, bounds.pendingMin + (own === undefined ? 0 : 1), bounds.pendingMax))
  ]
}
