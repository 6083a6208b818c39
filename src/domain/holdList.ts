/**
 * `list_holds`: a user's holds as an operator looks for a stuck one. Reads the state only; pending
 * holds and closed ones still remembered (the retry window), oldest first.
 */
import type { AdminCommand } from "./commands.js"
import type { HoldListEntry, HoldListResult } from "./results.js"
import type { Hold, UserState } from "./state.js"

type ListHolds = Extract<AdminCommand, { op: "list_holds" }>

const entryOf = (hold: Hold): HoldListEntry => ({
  id: hold.id,
  meter: hold.meter,
  amount: hold.amount,
  consumed: hold.consumed,
  state: hold.state,
  expiresAt: hold.expiresAt,
  createdAt: hold.createdAt
})

/** Oldest first; holds created in the same millisecond by id, so a listing is stable. */
const byCreation = (left: Hold, right: Hold): number =>
  left.createdAt - right.createdAt || (left.id < right.id ? -1 : left.id > right.id ? 1 : 0)

/**
 * Sorts what matches (at most pendingHoldsPerUserMax + closedHoldsPerUserMax holds, tens of ms at
 * the worst): the maps keep closing order, not creation order.
 */
export const listHolds = (state: UserState, command: ListHolds): HoldListResult => {
  const matching: Array<Hold> = []
  if (command.state !== "closed") for (const hold of state.pending.values()) matching.push(hold)
  if (command.state !== "pending") for (const hold of state.closed.values()) matching.push(hold)
  matching.sort(byCreation)
  return {
    status: "ok",
    holds: matching.slice(0, command.limit).map(entryOf),
    more: matching.length > command.limit
  }
}
