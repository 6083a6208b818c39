/**
 * The reads of the load judged against the per-user model: `get_usage` (the meter's figures and period,
 * the slots, the meters the load never touches) and `list_holds` (every hold certainly pending listed,
 * none that cannot be, each with figures it can have).
 */
import { meter } from "../cluster/cluster.js"
import type { Reply } from "./history.js"
import type { Window } from "./model.js"
import { holdAt, periodsOf, slotAt } from "./model.js"
import type { UserView } from "./view.js"
import { judgeUsedReserved, within } from "./view.js"

const periodShown = (periodStart: number | null, view: UserView): "before" | "after" | undefined => {
  const end = view.settings.monthEndAt
  if (end === undefined) return "before"
  if (periodStart === end) return "after"
  if (periodStart === view.settings.periodBefore) return "before"
  return undefined
}

interface MeterUsage {
  readonly meter: string
  readonly periodStart: number | null
  readonly limit: number
  readonly used: number
  readonly reserved: number
  readonly available: number
  readonly overage: number
  readonly pendingHolds: number
}

/** get_usage: the meter's figures, its period, and the slots against the model; the other meters untouched. */
export const judgeUsage = (reply: Reply, view: UserView, at: Window): Array<string> => {
  if (reply.status !== "ok") return [`answered ${reply.status}`]
  const problems: Array<string> = []
  const meters = (reply["meters"] ?? []) as ReadonlyArray<MeterUsage>
  for (const entry of meters) {
    if (entry.available !== entry.limit - entry.used - entry.reserved)
      problems.push(`${entry.meter}: available ${entry.available} is not limit - used - reserved`)
    if (entry.meter !== meter) {
      if (entry.used !== 0 || entry.reserved !== 0)
        problems.push(`${entry.meter}: used ${entry.used}, reserved ${entry.reserved}, never touched`)
      continue
    }
    const period = periodShown(entry.periodStart, view)
    const possible = periodsOf(view.calls, at, view.settings)
    if (period === undefined || !possible.includes(period))
      problems.push(`period ${entry.periodStart}, the model allows ${possible.join(" or ")} the month's end`)
    if (view.limit !== undefined && entry.limit !== view.limit)
      problems.push(`limit ${entry.limit}, set to ${view.limit}`)
    if (entry.overage !== 0) problems.push(`overage ${entry.overage}`)
    problems.push(
      ...judgeUsedReserved(entry.used, entry.reserved, entry.pendingHolds, view, at, undefined, period)
    )
  }
  const slots = reply["slots"] as {
    limit: number
    held: number
    jobs: ReadonlyArray<{ job: string }>
    waiting: number
  }
  if (slots.limit !== view.settings.slotLimit)
    problems.push(`slot limit ${slots.limit}, not ${view.settings.slotLimit}`)
  const clockMs = view.settings.clockOffsetMaxMs
  const states = [...view.slots.values()].map((flow) => ({ flow, slot: slotAt(flow, at, clockMs) }))
  const listed = new Set(slots.jobs.map((job) => job.job))
  problems.push(
    ...within(
      "slots held",
      slots.held,
      states.filter((state) => state.slot.certainlyHeld).length,
      states.filter((state) => state.slot.possiblyHeld).length
    )
  )
  for (const { flow, slot } of states) {
    if (slot.certainlyHeld && !listed.has(flow.job))
      problems.push(`job ${flow.job} certainly held, not listed`)
    if (listed.has(flow.job) && !slot.possiblyHeld) problems.push(`job ${flow.job} listed, cannot be held`)
  }
  for (const job of listed) if (!view.slots.has(job)) problems.push(`job ${job} listed, never acquired`)
  if (slots.waiting !== 0) problems.push(`${slots.waiting} waiting, none ever waits`)
  return problems
}

/** list_holds (pending): every hold certainly pending listed, none that cannot be, each as it can be. */
export const judgeHoldList = (reply: Reply, view: UserView, at: Window): Array<string> => {
  if (reply.status !== "ok") return [`answered ${reply.status}`]
  const clockMs = view.settings.clockOffsetMaxMs
  const problems: Array<string> = []
  const entries = (reply["holds"] ?? []) as ReadonlyArray<{
    id: string
    amount: number
    consumed: number
    state: string
    expiresAt: number
  }>
  const listed = new Set(entries.map((entry) => entry.id))
  for (const entry of entries) {
    const flow = view.holds.get(entry.id)
    if (flow === undefined) {
      problems.push(`hold ${entry.id} listed, never reserved`)
      continue
    }
    const hold = holdAt(flow, at, clockMs)
    if (entry.state !== "pending" || !hold.possiblyExists || hold.certainlyClosed)
      problems.push(`hold ${entry.id} listed ${entry.state}, cannot be pending`)
    if (entry.amount !== flow.amount)
      problems.push(`hold ${entry.id} listed of ${entry.amount}, reserved ${flow.amount}`)
    problems.push(...within(`hold ${entry.id} consumed`, entry.consumed, hold.consumedMin, hold.consumedMax))
    problems.push(...within(`hold ${entry.id} expiresAt`, entry.expiresAt, hold.expiresLo, hold.expiresHi))
  }
  if (reply["more"] !== true)
    for (const flow of view.holds.values()) {
      const hold = holdAt(flow, at, clockMs)
      if (hold.certainlyExists && !hold.possiblyClosed && !listed.has(flow.id))
        problems.push(`hold ${flow.id} certainly pending, not listed`)
    }
  return problems
}
