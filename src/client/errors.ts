/**
 * The client's failures, one tagged class each. The Promise methods reject with these instances; the
 * Effect methods carry them in the error channel. A protocol answer (`insufficient_quota`, `busy`,
 * `invalid_request`, ...) is a result, not one of these: only the helpers `withHold` and `withSlot`
 * turn a refusal into an error, because they cannot run the work without the grant.
 */
import { Data } from "effect"
import type { LimitBound, Result, SlotResult } from "../domain/results.js"
import type { ListUsageResult } from "./types.js"

/** Why the last attempt of a retried command failed. */
export type RetryReason = "unavailable" | "overloaded" | "no_responders" | "timeout"

/** Who and what a command was about, as its error names them: its user and its hold id, job or key. */
export interface CommandNames {
  readonly user?: string | undefined
  readonly id?: string | undefined
  readonly job?: string | undefined
  readonly key?: string | undefined
}

/** `user "u", hold "h", key "k"`: the names a command carried, for messages. */
export const describeNames = (names: CommandNames): string =>
  [
    names.user === undefined ? undefined : `user ${JSON.stringify(names.user)}`,
    names.id === undefined ? undefined : `hold ${JSON.stringify(names.id)}`,
    names.job === undefined ? undefined : `job ${JSON.stringify(names.job)}`,
    names.key === undefined ? undefined : `key ${JSON.stringify(names.key)}`
  ]
    .filter((part) => part !== undefined)
    .join(", ")

/** The names of a command object: its `user`, `id`, `job` and `key` when they are strings. */
export const namesOf = (command: object): CommandNames => {
  const fields = command as Record<string, unknown>
  const text = (key: string) => (typeof fields[key] === "string" ? fields[key] : undefined)
  return { user: text("user"), id: text("id"), job: text("job"), key: text("key") }
}

/** `limit 5000, used 0, ...`: every plain field a result carried besides its status, in its order. */
export const describeFigures = (result: object): string =>
  Object.entries(result)
    .filter(([key, value]) => key !== "status" && (value === null || typeof value !== "object"))
    .map(([key, value]) => `${key} ${typeof value === "string" ? JSON.stringify(value) : String(value)}`)
    .join(", ")

/** `op (user "u", hold "h")`. */
const describeCommand = (op: string, names: CommandNames): string => {
  const named = describeNames(names)
  return named === "" ? op : `${op} (${named})`
}

/** `status (figures)`, or the status alone when the result carried nothing else. */
const describeResult = (result: object & { readonly status: string }): string => {
  const figures = describeFigures(result)
  return figures === "" ? result.status : `${result.status} (${figures})`
}

/**
 * Every attempt of a command failed with a retryable outcome. For `unavailable` and `timeout` the
 * command may still have taken effect: a later call with the same `id`/`job`/`key` says what stands.
 */
export class QuotaRetriesExhausted extends Data.TaggedError("QuotaRetriesExhausted")<
  CommandNames & {
    readonly subject: string
    readonly op: string
    readonly attempts: number
    readonly reason: RetryReason
    /** From the first send to the failure. */
    readonly elapsedMs: number
  }
> {
  override get message(): string {
    return `quota: ${describeCommand(this.op, this)} on ${this.subject}: ${this.reason} after ${this.attempts} attempts in ${Math.round(this.elapsedMs)} ms`
  }
}

/**
 * The coordinator refused the whole message with the NATS service error headers (400: not JSON, too
 * large, a batch over the limit). Not retried: the same message would be refused again.
 */
export class QuotaServiceError extends Data.TaggedError("QuotaServiceError")<
  CommandNames & {
    readonly subject: string
    readonly op: string
    readonly code: number
    readonly description: string
  }
> {
  override get message(): string {
    return `quota: ${describeCommand(this.op, this)}: ${this.subject} answered service error ${this.code}: ${this.description}`
  }
}

/**
 * NATS failed in a way retrying cannot fix (connection closed, permission denied), or the reply broke
 * the protocol (not JSON, not one result per command).
 */
export class QuotaTransportError extends Data.TaggedError("QuotaTransportError")<
  CommandNames & {
    readonly subject: string
    readonly op: string
    readonly reason: string
    readonly cause?: unknown
  }
> {
  override get message(): string {
    return `quota: ${describeCommand(this.op, this)} on ${this.subject}: ${this.reason}`
  }
}

/** The client was closed before the command was sent or while it waited to be retried. */
export class QuotaClientClosed extends Data.TaggedError("QuotaClientClosed")<
  CommandNames & {
    readonly op: string
  }
> {
  override get message(): string {
    return `quota: ${describeCommand(this.op, this)}: the quota client is closed`
  }
}

/** What any operation may fail with. */
export type QuotaClientError =
  QuotaRetriesExhausted | QuotaServiceError | QuotaTransportError | QuotaClientClosed

/**
 * `withHold`, `withSlot`: a per-user bound of the coordinator was reached (PROTOCOL 1.2). Nothing
 * changed, and the same command gets the same answer until the user's holds or jobs end: a job queue
 * cancels the job (or frees what `bound` counts) rather than retrying it.
 */
export class LimitReached extends Data.TaggedError("LimitReached")<{
  readonly op: string
  readonly user: string
  /** The hold's id (`withHold`) or undefined. */
  readonly id?: string | undefined
  /** The slot's job (`withSlot`) or undefined. */
  readonly job?: string | undefined
  /** `pending_holds`, `consume_keys`, `slot_waiters` or `slots`. */
  readonly bound: LimitBound
  /** The bound's value. */
  readonly max: number
  readonly result: Result
}> {
  override get message(): string {
    return `quota: ${describeCommand(this.op, this)} refused: limit_reached, bound ${this.bound}, max ${this.max}`
  }
}

/** `withHold`: the reserve was answered with something other than `reserved`, `exists` or `limit_reached`. */
export class HoldNotGranted extends Data.TaggedError("HoldNotGranted")<{
  readonly user: string
  readonly id: string
  readonly result: Result
}> {
  override get message(): string {
    return `quota: hold ${JSON.stringify(this.id)} of user ${JSON.stringify(this.user)} not granted: ${describeResult(this.result)}`
  }
}

/** `withHold`: the work finished but its commit was not accepted (the hold expired or was released meanwhile). */
export class HoldNotCommitted extends Data.TaggedError("HoldNotCommitted")<{
  readonly user: string
  readonly id: string
  readonly result: Result
  readonly actual: number
}> {
  override get message(): string {
    return `quota: hold ${JSON.stringify(this.id)} of user ${JSON.stringify(this.user)} not committed (actual ${this.actual}): ${describeResult(this.result)}`
  }
}

/** `withSlot`: every slot of the user stayed taken through the wait; try again after `retryAfterMs`. */
export class SlotBusy extends Data.TaggedError("SlotBusy")<{
  readonly user: string
  readonly job: string
  readonly result: SlotResult
  readonly retryAfterMs: number
}> {
  override get message(): string {
    return `quota: slot for job ${JSON.stringify(this.job)} of user ${JSON.stringify(this.user)} busy (limit ${String(this.result.limit)}, held ${this.result.held}): retry after ${this.retryAfterMs} ms`
  }
}

/**
 * `withSlot`: the acquire was refused for another reason than `busy` or `limit_reached`
 * (`invalid_request`, `wrong_partition`).
 */
export class SlotNotGranted extends Data.TaggedError("SlotNotGranted")<{
  readonly user: string
  readonly job: string
  readonly result: Result
}> {
  override get message(): string {
    return `quota: slot for job ${JSON.stringify(this.job)} of user ${JSON.stringify(this.user)} not granted: ${describeResult(this.result)}`
  }
}

/** `withSlot`: a renewal answered `not_found`: the lease ended and the slot may be someone else's now. */
export class SlotLeaseLost extends Data.TaggedError("SlotLeaseLost")<{
  readonly user: string
  readonly job: string
}> {
  override get message(): string {
    return `quota: slot lease of job ${JSON.stringify(this.job)} of user ${JSON.stringify(this.user)} was lost`
  }
}

/**
 * `acquireSlot`, `withSlot`: the caller's `signal` aborted before a slot was granted. The wait was
 * withdrawn (an `acquire_slot` of the job with `waitMs` 0 replaced it) and what that answer granted was
 * released, so the slot goes to the next waiter. `withdrawn`/`released` are those answers' statuses
 * (undefined: not sent, or failed; the lease then ends on its own); `reason` is the signal's.
 */
export class SlotWaitAborted extends Data.TaggedError("SlotWaitAborted")<{
  readonly user: string
  readonly job: string
  readonly waitMs: number
  readonly withdrawn: string | undefined
  readonly released: string | undefined
  readonly reason: unknown
}> {
  override get message(): string {
    const withdrawn = this.withdrawn === undefined ? "" : `, withdraw answered ${this.withdrawn}`
    const released = this.released === undefined ? "" : `, release answered ${this.released}`
    return `quota: slot wait of job ${JSON.stringify(this.job)} of user ${JSON.stringify(this.user)} (waitMs ${this.waitMs}) aborted${withdrawn}${released}`
  }
}

/**
 * `usagePages`: a partition answered `list_usage` with a refusal (`unknown_meter`, or
 * `invalid_request`: a `periodStart` that is not one of the meter's periods, or given for a `none`
 * meter). The pages yielded before it were the meter's all the same; the walk stops here.
 */
export class UsageListRefused extends Data.TaggedError("UsageListRefused")<{
  readonly partition: number
  readonly meter: string
  readonly result: Exclude<ListUsageResult, { readonly status: "ok" }>
}> {
  override get message(): string {
    return `quota: list_usage of meter ${JSON.stringify(this.meter)} on partition ${this.partition} refused: ${describeResult(this.result)}`
  }
}

/**
 * `QuotaClient.connect`: a subject setting of the client (an option or QUOTA_PREFIX/QUOTA_PARTITIONS)
 * differs from what the running coordinator announces in its `$SRV.INFO` metadata. With another
 * partition count every user would hash to another coordinator's subject, so the client refuses.
 */
export class CoordinatorDisagrees extends Data.TaggedError("CoordinatorDisagrees")<{
  readonly setting: "prefix" | "partitions"
  /** The client's value and where it came from (`option partitions`, `QUOTA_PARTITIONS`). */
  readonly client: string | number
  readonly source: string
  readonly coordinator: string | number
  /** The `id` of the coordinator instance that answered. */
  readonly serviceId: string
}> {
  override get message(): string {
    return `quota: ${this.setting} ${JSON.stringify(this.client)} (from ${this.source}) disagrees with the running coordinator's ${JSON.stringify(this.coordinator)} (service id ${this.serviceId}): set one or the other so they agree`
  }
}

/** `QuotaClient.connect` with `discover`: no coordinator, or no single one, could be learned from. */
export class DiscoveryFailed extends Data.TaggedError("DiscoveryFailed")<{
  /** The prefix looked for, when the client had one. */
  readonly prefix: string | undefined
  readonly reason: string
}> {
  override get message(): string {
    const prefix = this.prefix === undefined ? "" : ` for prefix ${JSON.stringify(this.prefix)}`
    return `quota: discovering the coordinator${prefix} failed: ${this.reason}`
  }
}
