/**
 * One wire command (parsed JSON, untrusted) to a domain `Command`, exactly per PROTOCOL.md: the op must
 * be one of the subject's kind, required fields present, optional `null` counts as absent, unknown fields
 * ignored, numbers integers within their bounds, strings within their byte lengths. Then the partition.
 *
 * This runs for every command, so it is plain code, not Schema. A bad field throws a `FieldInvalid`
 * (a plain object, no stack capture) that `decodeCommand` turns into a value: each reader stays one line.
 */
import type {
  AdminCommand,
  Command,
  HoldListState,
  ListUsageCommand,
  OpsCommand
} from "../domain/commands.js"
import { meterNamePattern } from "../domain/config.js"
import {
  amountMax,
  holdTtlMsDefault,
  holdTtlMsMax,
  holdTtlMsMin,
  holdListLimitDefault,
  holdListLimitMax,
  identifierBytesMax,
  slotLeaseMsDefault,
  slotLeaseMsMax,
  slotLeaseMsMin,
  slotWaitMsMax,
  usageHistoryPeriodsDefault,
  usageHistoryPeriodsMax,
  usageListLimitDefault,
  usageListLimitMax
} from "../domain/limits.js"
import { partitionOf } from "../domain/partition.js"
import type { InvalidRequestResult, WrongPartitionResult } from "../domain/results.js"
import { invalidRequest } from "../domain/results.js"

/** `.ops` takes the operations, `.admin` the administration (PROTOCOL.md "Subjects"). */
export type SubjectKind = "ops" | "admin"

export type Decoded =
  | { readonly ok: Command | ListUsageCommand; readonly ref?: string }
  | { readonly invalid: string; readonly ref?: string }

/**
 * A command judged before any decision: it goes to its user's actor, or (`list_usage`, addressed to a
 * partition) to the coordinator itself, or its answer is known now.
 */
export type Judged =
  | { readonly submit: Command; readonly ref: string | undefined }
  | { readonly listUsage: ListUsageCommand; readonly ref: string | undefined }
  | { readonly answer: InvalidRequestResult | WrongPartitionResult; readonly ref: string | undefined }

const opsOps: ReadonlySet<string> = new Set<OpsCommand["op"]>([
  "reserve",
  "consume",
  "commit",
  "release",
  "extend",
  "adjust",
  "acquire_slot",
  "renew_slot",
  "release_slot",
  "get_usage"
])
const adminOps: ReadonlySet<string> = new Set<AdminCommand["op"] | ListUsageCommand["op"]>([
  "set_plan",
  "set_limit",
  "get_usage",
  "list_holds",
  "usage_history",
  "list_usage"
])

const holdListStates: ReadonlySet<string> = new Set<HoldListState>(["pending", "closed", "all"])

class FieldInvalid {
  constructor(readonly error: string) {}
}

const fail = (field: string, what: string): never => {
  throw new FieldInvalid(`${field}: ${what}`)
}

type WireObject = Readonly<Record<string, unknown>>

/** Own fields only, so `constructor` or `__proto__` tricks never reach Object.prototype; null is absent. */
const fieldOf = (raw: WireObject, field: string): unknown => {
  const value = Object.hasOwn(raw, field) ? raw[field] : undefined
  return value === null ? undefined : value
}

/** A lone surrogate has no UTF-8 form: Postgres would store U+FFFD and two users would become one. */
const loneSurrogate = /\p{Cs}/u

const utf8Bytes = (text: string): number => Buffer.byteLength(text, "utf8")

/**
 * A user, id, job or key: well-formed Unicode of 1..256 UTF-8 bytes (U+0000 included: the store
 * escapes it, src/store/postgres/storedText.ts).
 */
const identifier = (raw: WireObject, field: string, allowEmpty = false): string => {
  const value = fieldOf(raw, field)
  if (value === undefined) return fail(field, "required")
  if (typeof value !== "string") return fail(field, "must be a string")
  if (value === "" && !allowEmpty) return fail(field, "must not be empty")
  const bytes = utf8Bytes(value)
  if (bytes > identifierBytesMax) return fail(field, `is ${bytes} UTF-8 bytes, over ${identifierBytesMax}`)
  if (loneSurrogate.test(value)) return fail(field, "must be well-formed Unicode (a lone surrogate)")
  return value
}

const meter = (raw: WireObject): string => {
  const value = fieldOf(raw, "meter")
  if (value === undefined) return fail("meter", "required")
  if (typeof value !== "string") return fail("meter", "must be a string")
  if (!meterNamePattern.test(value)) return fail("meter", `must match ${meterNamePattern.source}`)
  return value
}

const integerIn = (value: unknown, field: string, min: number, max: number): number =>
  typeof value === "number" && Number.isSafeInteger(value) && value >= min && value <= max
    ? value
    : fail(field, `must be an integer from ${min} to ${max}`)

const amount = (raw: WireObject, field = "amount"): number => {
  const value = fieldOf(raw, field)
  return value === undefined ? fail(field, "required") : integerIn(value, field, 0, amountMax)
}

const optionalAmount = (raw: WireObject): number | undefined => {
  const value = fieldOf(raw, "amount")
  return value === undefined ? undefined : integerIn(value, "amount", 0, amountMax)
}

const signedAmount = (raw: WireObject): number => {
  const value = fieldOf(raw, "amount")
  return value === undefined ? fail("amount", "required") : integerIn(value, "amount", -amountMax, amountMax)
}

const duration = (raw: WireObject, field: string, min: number, max: number, fallback?: number): number => {
  const value = fieldOf(raw, field)
  if (value === undefined) return fallback ?? fail(field, "required")
  return integerIn(value, field, min, max)
}

const ttlMs = (raw: WireObject, fallback?: number): number =>
  duration(raw, "ttlMs", holdTtlMsMin, holdTtlMsMax, fallback)

const leaseMs = (raw: WireObject): number =>
  duration(raw, "leaseMs", slotLeaseMsMin, slotLeaseMsMax, slotLeaseMsDefault)

const user = (raw: WireObject): string => identifier(raw, "user")
/** Slot commands accept the empty user: a system job. */
const slotUser = (raw: WireObject): string => identifier(raw, "user", true)

const decodeOps = (op: OpsCommand["op"], raw: WireObject): OpsCommand => {
  switch (op) {
    case "reserve":
      return {
        op,
        user: user(raw),
        meter: meter(raw),
        amount: amount(raw),
        id: identifier(raw, "id"),
        ttlMs: ttlMs(raw, holdTtlMsDefault)
      }
    case "consume":
      return {
        op,
        user: user(raw),
        id: identifier(raw, "id"),
        amount: amount(raw),
        key: identifier(raw, "key")
      }
    case "commit":
      return { op, user: user(raw), id: identifier(raw, "id"), amount: optionalAmount(raw) }
    case "release":
      return { op, user: user(raw), id: identifier(raw, "id") }
    case "extend":
      return { op, user: user(raw), id: identifier(raw, "id"), ttlMs: ttlMs(raw) }
    case "adjust":
      return { op, user: user(raw), meter: meter(raw), amount: signedAmount(raw), id: identifier(raw, "id") }
    case "acquire_slot":
      return {
        op,
        user: slotUser(raw),
        job: identifier(raw, "job"),
        leaseMs: leaseMs(raw),
        waitMs: duration(raw, "waitMs", 0, slotWaitMsMax, 0)
      }
    case "renew_slot":
      return { op, user: slotUser(raw), job: identifier(raw, "job"), leaseMs: leaseMs(raw) }
    case "release_slot":
      return { op, user: slotUser(raw), job: identifier(raw, "job") }
    case "get_usage":
      return { op, user: user(raw) }
  }
}

const optionalMeter = (raw: WireObject): string | undefined =>
  fieldOf(raw, "meter") === undefined ? undefined : meter(raw)

const optionalInteger = (raw: WireObject, field: string, min: number, max: number, fallback: number) => {
  const value = fieldOf(raw, field)
  return value === undefined ? fallback : integerIn(value, field, min, max)
}

/** Revision 1.3: `list_usage`, to the partition of the subject it came on (it names no user). */
const decodeListUsage = (raw: WireObject, partition: number): ListUsageCommand => {
  const listed = meter(raw)
  const periodStart = fieldOf(raw, "periodStart")
  return {
    op: "list_usage",
    partition,
    meter: listed,
    periodStart: periodStart === undefined ? null : integerIn(periodStart, "periodStart", 0, amountMax),
    after: fieldOf(raw, "after") === undefined ? undefined : identifier(raw, "after"),
    limit: optionalInteger(raw, "limit", 1, usageListLimitMax, usageListLimitDefault)
  }
}

const decodeAdmin = (op: AdminCommand["op"], raw: WireObject): AdminCommand => {
  switch (op) {
    case "set_plan": {
      const command = { op, user: user(raw), plan: fieldOf(raw, "plan") }
      if (command.plan === undefined) return fail("plan", "required")
      if (typeof command.plan !== "string") return fail("plan", "must be a string")
      return { ...command, plan: command.plan }
    }
    case "set_limit": {
      const command = { op, user: user(raw), meter: meter(raw) }
      // `limit: null` is a value here (back to the plan's default), so it is read without fieldOf.
      const value = Object.hasOwn(raw, "limit") ? raw["limit"] : undefined
      if (value === undefined) return fail("limit", "required (an amount, or null for the plan's limit)")
      const limit = value === null ? null : integerIn(value, "limit", 0, amountMax)
      return { ...command, limit }
    }
    case "get_usage":
      return { op, user: user(raw) }
    case "list_holds": {
      const listed = user(raw)
      const state = fieldOf(raw, "state") ?? "pending"
      if (typeof state !== "string" || !holdListStates.has(state))
        return fail("state", "must be pending, closed or all")
      const limit = fieldOf(raw, "limit")
      return {
        op,
        user: listed,
        state: state as HoldListState,
        limit: limit === undefined ? holdListLimitDefault : integerIn(limit, "limit", 1, holdListLimitMax)
      }
    }
    case "usage_history":
      return {
        op,
        user: user(raw),
        meter: optionalMeter(raw),
        periods: optionalInteger(raw, "periods", 1, usageHistoryPeriodsMax, usageHistoryPeriodsDefault)
      }
  }
}

const readRef = (raw: WireObject): string | undefined => {
  const ref = fieldOf(raw, "ref")
  if (ref === undefined) return undefined
  if (typeof ref !== "string") return fail("ref", "must be a string")
  const bytes = utf8Bytes(ref)
  return bytes > identifierBytesMax ? fail("ref", `is ${bytes} UTF-8 bytes, over ${identifierBytesMax}`) : ref
}

const readOp = (raw: WireObject, kind: SubjectKind): string => {
  const op = fieldOf(raw, "op")
  if (op === undefined) return fail("op", "required")
  if (typeof op !== "string") return fail("op", "must be a string")
  if ((kind === "ops" ? opsOps : adminOps).has(op)) return op
  const other: SubjectKind = kind === "ops" ? "admin" : "ops"
  if ((kind === "ops" ? adminOps : opsOps).has(op))
    return fail("op", `${op} is sent to .${other}, not .${kind}`)
  return fail("op", `unknown operation ${JSON.stringify(op.slice(0, 64))}`)
}

const isWireObject = (raw: unknown): raw is WireObject =>
  typeof raw === "object" && raw !== null && !Array.isArray(raw)

/**
 * Decodes one command of a message sent to a `.ops` or `.admin` subject; `partition`: the subject's,
 * which a `list_usage` is about.
 */
export const decodeCommand = (raw: unknown, kind: SubjectKind, partition = 0): Decoded => {
  if (!isWireObject(raw)) return { invalid: "command: must be an object" }
  let ref: string | undefined
  try {
    ref = readRef(raw)
  } catch (error) {
    // An invalid ref is not echoed: the caller cannot have meant it.
    if (error instanceof FieldInvalid) return { invalid: error.error }
    throw error
  }
  try {
    const op = readOp(raw, kind)
    const command =
      kind === "ops"
        ? decodeOps(op as OpsCommand["op"], raw)
        : op === "list_usage"
          ? decodeListUsage(raw, partition)
          : decodeAdmin(op as AdminCommand["op"], raw)
    return ref === undefined ? { ok: command } : { ok: command, ref }
  } catch (error) {
    if (!(error instanceof FieldInvalid)) throw error
    return ref === undefined ? { invalid: error.error } : { invalid: error.error, ref }
  }
}

const wrongPartition: WrongPartitionResult = { status: "wrong_partition" }

/**
 * PROTOCOL.md's order: shape and fields, then partition; the decision comes after, in the coordinator.
 * System jobs (empty user) hash like any other user: `fnv1a32("") mod P`.
 */
export const judgeCommand = (
  raw: unknown,
  kind: SubjectKind,
  partition: number,
  partitions: number
): Judged => {
  const decoded = decodeCommand(raw, kind, partition)
  if ("invalid" in decoded) return { answer: invalidRequest(decoded.invalid), ref: decoded.ref }
  if (decoded.ok.op === "list_usage") return { listUsage: decoded.ok, ref: decoded.ref }
  if (partitionOf(decoded.ok.user, partitions) !== partition)
    return { answer: wrongPartition, ref: decoded.ref }
  return { submit: decoded.ok, ref: decoded.ref }
}
