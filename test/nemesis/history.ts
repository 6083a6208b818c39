/**
 * What the nemesis's load did, call by call, for the model (model.ts) to judge: every call with its
 * input, when it was sent and answered (on the world's clock: what Postgres reads, and what the
 * processes read but for their own faults), and its reply or its failure. A call is one SDK call: its
 * retries (the same ids) are inside it, so whatever it did happened between `sentAt` and `repliedAt`.
 */

export type CallOp =
  | "set_limit"
  | "reserve"
  | "consume"
  | "extend"
  | "commit"
  | "release"
  | "acquire_slot"
  | "renew_slot"
  | "release_slot"
  | "get_usage"
  | "list_holds"

/** A reply as it came, fields by name (the model reads what its op carries). */
export type Reply = Readonly<Record<string, unknown>> & { readonly status: string }

export interface Call {
  /** The order calls were sent in, over the whole load. */
  readonly index: number
  readonly op: CallOp
  readonly user: string
  /** The hold id or the job; "" for reads and set_limit. */
  readonly flow: string
  /** amount, key, ttlMs, leaseMs, limit: what the op takes. */
  readonly input: Readonly<Record<string, number | string>>
  /** World time when the call was sent (its first attempt). */
  readonly sentAt: number
  /** World time when its reply (or its failure) arrived; undefined while in flight. */
  repliedAt?: number
  reply?: Reply
  /** The SDK's retries ran out: its outcome is unknown for good. */
  failed?: string
}

/** A call that has not answered (yet, or ever): what it did, if anything, is unknown. */
export const unresolved = (call: Call): boolean => call.reply === undefined

/** The reply's status, or "" when there is none (in flight or failed). */
export const statusOf = (call: Call): string => call.reply?.status ?? ""

/** A reply's number field; NaN when absent (a check against NaN fails, which is what a missing field is). */
export const numberOf = (reply: Reply | undefined, field: string): number => {
  const value = reply?.[field]
  return typeof value === "number" ? value : Number.NaN
}

/** When the call ended, or Infinity while it may still act (in flight, or failed: never known). */
export const endOf = (call: Call): number =>
  call.reply === undefined || call.repliedAt === undefined ? Infinity : call.repliedAt

/** The users a text names (the load's: `<label>h-...` and `<label>s-...`, up to a space or a slash). */
export const usersNamed = (text: string, label: string): Array<string> => [
  ...new Set(text.match(new RegExp(`${label}[hs]-[0-9]+-[0-9]+-[0-9]+`, "g")) ?? [])
]

/** One call as the results show it: times in ms from `zero` (world time), the reply's telling fields. */
export const describeCall = (call: Call, zero: number): string => {
  const reply = call.reply
  const fields = ["used", "reserved", "available", "consumed", "state", "held", "pendingHolds"]
    .filter((field) => reply?.[field] !== undefined)
    .map((field) => `${field} ${String(reply![field])}`)
  const instants = ["expiresAt", "leaseExpiresAt"]
    .filter((field) => typeof reply?.[field] === "number")
    .map((field) => `${field} +${(reply![field] as number) - zero}`)
  const input = Object.entries(call.input)
    .map(([name, value]) => `${name} ${value}`)
    .join(", ")
  return (
    `+${call.sentAt - zero}..${call.repliedAt === undefined ? "?" : `+${call.repliedAt - zero}`} ms ` +
    `${call.op} ${call.flow}${input === "" ? "" : ` (${input})`}: ` +
    `${call.failed === undefined ? (reply?.status ?? "in flight") : `FAILED ${call.failed}`}` +
    `${[...fields, ...instants].length === 0 ? "" : ` [${[...fields, ...instants].join(", ")}]`}`
  )
}

/** How many calls of a user the results show, and how close in time to a named one they must be. */
const evidenceCallsMax = 80
const evidenceNearMs = 2_000

/**
 * The calls of `user` a violation's reader needs: those of the holds and jobs the violations name, and
 * the user's other calls sent within two seconds of one of them (the reads and grants around it).
 */
export const evidenceOf = (
  calls: ReadonlyArray<Call>,
  user: string,
  violations: ReadonlyArray<string>
): Array<Call> => {
  const lines = violations.filter((what) => what.includes(user))
  const named = calls.filter(
    (call) =>
      call.flow !== "" &&
      lines.some((line) => line.includes(`${user}/${call.flow}`) || line.includes(` ${call.flow} `))
  )
  const near = (call: Call) => named.some((other) => Math.abs(other.sentAt - call.sentAt) <= evidenceNearMs)
  const shown = calls.filter((call) => named.includes(call) || near(call))
  return (shown.length > 0 ? shown : calls).slice(-evidenceCallsMax)
}
