/**
 * The client's failures, one tagged class each. The Promise methods reject with these instances; the
 * Effect methods carry them in the error channel. A protocol answer (`insufficient_quota`, `busy`,
 * `invalid_request`, ...) is a result, not one of these: only the helpers `withHold` and `withSlot`
 * turn a refusal into an error, because they cannot run the work without the grant.
 */
import { Data } from "effect"
import type { Result, SlotResult } from "../domain/results.js"

/** Why the last attempt of a retried command failed. */
export type RetryReason = "unavailable" | "overloaded" | "no_responders" | "timeout"

/**
 * Every attempt of a command failed with a retryable outcome. For `unavailable` and `timeout` the
 * command may still have taken effect: a later call with the same `id`/`job`/`key` says what stands.
 */
export class QuotaRetriesExhausted extends Data.TaggedError("QuotaRetriesExhausted")<{
  readonly subject: string
  readonly op: string
  readonly attempts: number
  readonly reason: RetryReason
}> {
  override get message(): string {
    return `${this.op} on ${this.subject}: ${this.reason} after ${this.attempts} attempts`
  }
}

/**
 * The coordinator refused the whole message with the NATS service error headers (400: not JSON, too
 * large, a batch over the limit). Not retried: the same message would be refused again.
 */
export class QuotaServiceError extends Data.TaggedError("QuotaServiceError")<{
  readonly subject: string
  readonly code: number
  readonly description: string
}> {
  override get message(): string {
    return `${this.subject} answered service error ${this.code}: ${this.description}`
  }
}

/**
 * NATS failed in a way retrying cannot fix (connection closed, permission denied), or the reply broke
 * the protocol (not JSON, not one result per command).
 */
export class QuotaTransportError extends Data.TaggedError("QuotaTransportError")<{
  readonly subject: string
  readonly reason: string
  readonly cause?: unknown
}> {
  override get message(): string {
    return `${this.subject}: ${this.reason}`
  }
}

/** The client was closed before the command was sent or while it waited to be retried. */
export class QuotaClientClosed extends Data.TaggedError("QuotaClientClosed")<{
  readonly op: string
}> {
  override get message(): string {
    return `${this.op}: the quota client is closed`
  }
}

/** What any operation may fail with. */
export type QuotaClientError =
  QuotaRetriesExhausted | QuotaServiceError | QuotaTransportError | QuotaClientClosed

/** `withHold`: the reserve was answered with something other than `reserved` or `exists`. */
export class HoldNotGranted extends Data.TaggedError("HoldNotGranted")<{
  readonly result: Result
}> {
  override get message(): string {
    return `hold not granted: ${this.result.status}`
  }
}

/** `withHold`: the work finished but its commit was not accepted (the hold expired or was released meanwhile). */
export class HoldNotCommitted extends Data.TaggedError("HoldNotCommitted")<{
  readonly result: Result
  readonly actual: number
}> {
  override get message(): string {
    return `hold not committed (${this.actual}): ${this.result.status}`
  }
}

/** `withSlot`: every slot of the user stayed taken through the wait; try again after `retryAfterMs`. */
export class SlotBusy extends Data.TaggedError("SlotBusy")<{
  readonly result: SlotResult
  readonly retryAfterMs: number
}> {
  override get message(): string {
    return `slot busy: retry after ${this.retryAfterMs} ms`
  }
}

/**
 * `withSlot`: the acquire was refused for another reason than `busy` (`invalid_request`,
 * `wrong_partition`, `limit_reached`).
 */
export class SlotNotGranted extends Data.TaggedError("SlotNotGranted")<{
  readonly result: Result
}> {
  override get message(): string {
    return `slot not granted: ${this.result.status}`
  }
}

/** `withSlot`: a renewal answered `not_found`: the lease ended and the slot may be someone else's now. */
export class SlotLeaseLost extends Data.TaggedError("SlotLeaseLost")<{
  readonly job: string
}> {
  override get message(): string {
    return `slot lease of job ${this.job} was lost`
  }
}
