/**
 * Results: the closed union of PROTOCOL.md's statuses. Rejections are values of this union; a bug is
 * an assertion that crashes the actor, never a result.
 */

export type HoldState = "pending" | "committed" | "released" | "expired"

/** A meter's state after a decision. */
export interface MeterView {
  readonly meter: string
  readonly limit: number
  readonly used: number
  readonly reserved: number
  readonly available: number
  readonly overage: number
}

export interface HoldView {
  readonly id: string
  readonly amount: number
  readonly consumed: number
  readonly state: HoldState
  readonly expiresAt: number
}

export type HoldStatus =
  "reserved" | "consumed" | "committed" | "released" | "extended" | "exists" | "conflict" | "closed"

export type HoldResult = { readonly status: HoldStatus } & MeterView & HoldView

export type InsufficientQuotaResult = {
  readonly status: "insufficient_quota"
  readonly requested: number
  readonly pendingHolds: number
} & MeterView

export type AdjustResult = {
  readonly status: "adjusted" | "exists" | "conflict"
  readonly id: string
} & MeterView

export interface SlotResult {
  readonly status: "acquired" | "exists" | "renewed" | "released" | "not_found" | "busy"
  /** Slots the plan allows; null for a system job or with fairness off. */
  readonly limit: number | null
  readonly held: number
  readonly job?: string
  readonly leaseExpiresAt?: number
  readonly retryAfterMs?: number
}

export interface MeterUsage extends MeterView {
  readonly period: "month" | "day" | "none"
  readonly periodStart: number | null
  readonly pendingHolds: number
}

export interface UsageResult {
  readonly status: "ok"
  readonly plan: string
  readonly meters: ReadonlyArray<MeterUsage>
  readonly slots: {
    readonly limit: number | null
    readonly held: number
    readonly jobs: ReadonlyArray<{ readonly job: string; readonly leaseExpiresAt: number }>
    readonly waiting: number
  }
}

/** One hold as `list_holds` shows it. */
export interface HoldListEntry extends HoldView {
  readonly meter: string
  readonly createdAt: number
}

export interface HoldListResult {
  readonly status: "ok"
  /** Oldest first (by createdAt), at most the command's `limit`. */
  readonly holds: ReadonlyArray<HoldListEntry>
  /** True when more holds matched than were listed. */
  readonly more: boolean
}

export interface UsageHistoryEntry {
  readonly meter: string
  readonly period: "month" | "day"
  /** Newest first: the current period always, an earlier one only if it had usage. */
  readonly periods: ReadonlyArray<{ readonly periodStart: number; readonly used: number }>
}

export interface UsageHistoryResult {
  readonly status: "ok"
  readonly history: ReadonlyArray<UsageHistoryEntry>
}

export interface UsageListResult {
  readonly status: "ok"
  readonly usage: ReadonlyArray<{ readonly user: string; readonly used: number }>
  readonly more: boolean
}

export interface OkResult {
  readonly status: "ok"
}

export interface NotFoundResult {
  readonly status: "not_found"
}
export interface UnknownMeterResult {
  readonly status: "unknown_meter"
}
export interface UnknownPlanResult {
  readonly status: "unknown_plan"
}
export interface InvalidRequestResult {
  readonly status: "invalid_request"
  readonly error: string
}
export interface WrongPartitionResult {
  readonly status: "wrong_partition"
}
export interface UnavailableResult {
  readonly status: "unavailable"
}
export interface OverloadedResult {
  readonly status: "overloaded"
}

/** The per-user bounds PROTOCOL.md (revision 1.2) names in `limit_reached` (values in limits.ts). */
export type LimitBound = "pending_holds" | "consume_keys" | "slot_waiters" | "slots"

/**
 * A per-user bound is reached; nothing changed. Not retryable as it is: the caller frees what the
 * bound counts (commits or releases holds, ends jobs), unlike `overloaded`, which a pause fixes.
 */
export interface LimitReachedResult {
  readonly status: "limit_reached"
  readonly bound: LimitBound
  readonly max: number
}

export type Result =
  | HoldResult
  | InsufficientQuotaResult
  | AdjustResult
  | SlotResult
  | UsageResult
  | HoldListResult
  | UsageHistoryResult
  | UsageListResult
  | OkResult
  | NotFoundResult
  | UnknownMeterResult
  | UnknownPlanResult
  | InvalidRequestResult
  | WrongPartitionResult
  | UnavailableResult
  | OverloadedResult
  | LimitReachedResult

export type Status = Result["status"]

export const unavailable: UnavailableResult = { status: "unavailable" }
export const overloaded: OverloadedResult = { status: "overloaded" }
export const notFound: NotFoundResult = { status: "not_found" }
export const unknownMeter: UnknownMeterResult = { status: "unknown_meter" }
export const limitReached = (bound: LimitBound, max: number): LimitReachedResult => ({
  status: "limit_reached",
  bound,
  max
})
export const invalidRequest = (error: string): InvalidRequestResult => ({ status: "invalid_request", error })
