/**
 * `list_holds`: a user's holds as an operator looks for a stuck one. Reads the state only; pending
 * holds and closed ones still remembered (the retry window), oldest first.
 *
 * A listing is bounded in bytes as well as in holds: it stops before the hold whose JSON would take
 * the listed holds past holdListReplyBytesMax, and says `more: true`. Ids of 256 bytes (up to six
 * times that once escaped as JSON) made 1 000 holds a reply of megabytes, built whole before the
 * transport found it larger than NATS's max payload.
 */
import type { AdminCommand } from "./commands.js"
import { holdListReplyBytesMax } from "./limits.js"
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

/** UTF-8 bytes of well-formed text (JSON.stringify escapes lone surrogates, so a pair is 4 bytes). */
const utf8Bytes = (text: string): number => {
  let bytes = text.length
  for (let index = 0; index < text.length; index += 1) {
    const unit = text.charCodeAt(index)
    if (unit < 0x80) continue
    if (unit < 0x800) bytes += 1
    else if (unit >= 0xd800 && unit <= 0xdbff) {
      // A surrogate pair: its 2 units are counted already, and it is 4 bytes.
      bytes += 2
      index += 1
    } else bytes += 2
  }
  return bytes
}

/**
 * Sorts what matches (at most pendingHoldsPerUserMax + closedHoldsPerUserMax holds, tens of ms at
 * the worst): the maps keep closing order, not creation order. `replyBytesMax` is for tests.
 */
export const listHolds = (
  state: UserState,
  command: ListHolds,
  replyBytesMax: number = holdListReplyBytesMax
): HoldListResult => {
  const matching: Array<Hold> = []
  if (command.state !== "closed") for (const hold of state.pending.values()) matching.push(hold)
  if (command.state !== "pending") for (const hold of state.closed.values()) matching.push(hold)
  matching.sort(byCreation)
  const holds: Array<HoldListEntry> = []
  let bytes = 0
  for (const hold of matching) {
    if (holds.length === command.limit) break
    const entry = entryOf(hold)
    // The entry's JSON and the comma before the next one.
    bytes += utf8Bytes(JSON.stringify(entry)) + 1
    if (bytes > replyBytesMax) break
    holds.push(entry)
  }
  return { status: "ok", holds, more: matching.length > holds.length }
}
