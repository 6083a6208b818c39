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

/** Its fields are what entryBytes counts: change both together. */
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

/** Bytes of `text` as JSON.stringify writes it in UTF-8, quotes included, without building it. */
const jsonStringBytes = (text: string): number => {
  let bytes = 2
  for (let index = 0; index < text.length; index += 1) {
    const unit = text.charCodeAt(index)
    if (unit === 0x22 || unit === 0x5c)
      bytes += 2 // \" and \\
    else if (unit < 0x20)
      // \b \t \n \f \r, the others as \u00XX
      bytes += unit === 0x08 || unit === 0x09 || unit === 0x0a || unit === 0x0c || unit === 0x0d ? 2 : 6
    else if (unit < 0x80) bytes += 1
    else if (unit < 0x800) bytes += 2
    else if (unit >= 0xd800 && unit <= 0xdfff) {
      const next = text.charCodeAt(index + 1)
      if (unit <= 0xdbff && next >= 0xdc00 && next <= 0xdfff) {
        bytes += 4 // a pair: one 4-byte character
        index += 1
      } else bytes += 6 // a lone surrogate, escaped as \udXXX
    } else bytes += 3
  }
  return bytes
}

/** Characters of a safe integer in decimal, as JSON writes it. */
const decimalDigits = (value: number): number => {
  let digits = value < 0 ? 2 : 1
  for (let rest = Math.abs(value); rest >= 10; rest = Math.floor(rest / 10)) digits += 1
  return digits
}

/** `{"id":,"meter":,"amount":,"consumed":,"state":,"expiresAt":,"createdAt":}` around the values. */
const entryFrameBytes = 73

/** Bytes of `JSON.stringify(entry)`, counted (a listing's bound is checked per hold: no string built). */
const entryBytes = (entry: HoldListEntry): number =>
  entryFrameBytes +
  jsonStringBytes(entry.id) +
  jsonStringBytes(entry.meter) +
  decimalDigits(entry.amount) +
  decimalDigits(entry.consumed) +
  entry.state.length +
  2 +
  decimalDigits(entry.expiresAt) +
  decimalDigits(entry.createdAt)

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
    bytes += entryBytes(entry) + 1
    if (bytes > replyBytesMax) break
    holds.push(entry)
  }
  return { status: "ok", holds, more: matching.length > holds.length }
}
