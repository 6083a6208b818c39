/**
 * What each client method takes and answers: PROTOCOL.md's fields and result shapes, per operation.
 * The results reuse the domain's result types; `unavailable` and `overloaded` never reach a caller
 * (the client retries them, then fails with `QuotaRetriesExhausted`). `limit_reached` (revision 1.2: a
 * per-user bound of the coordinator) does, unretried: the same command would get the same answer until
 * the caller frees what the bound counts.
 */
import type {
  AdjustResult,
  HoldListResult,
  HoldResult,
  InsufficientQuotaResult,
  InvalidRequestResult,
  LimitReachedResult,
  NotFoundResult,
  OkResult,
  SlotResult,
  UnknownMeterResult,
  UnknownPlanResult,
  UsageHistoryResult,
  UsageListResult,
  UsageResult,
  WrongPartitionResult
} from "../domain/results.js"

/** Any command may carry `ref` (at most 256 bytes), echoed back on its result whatever the status. */
interface WithRef {
  readonly ref?: string
}

export interface ReserveInput extends WithRef {
  readonly user: string
  readonly meter: string
  readonly amount: number
  /** The hold's id (the job id): retries and repeats with the same id are answered `exists`. */
  readonly id: string
  readonly ttlMs?: number
}

export interface ConsumeInput extends WithRef {
  readonly user: string
  readonly id: string
  readonly amount: number
  /** Idempotency key of this consumption, unique within the hold. */
  readonly key: string
}

export interface CommitInput extends WithRef {
  readonly user: string
  readonly id: string
  /** The work's total actual usage; default the larger of the hold's amount and what was consumed. */
  readonly amount?: number
}

export interface ReleaseInput extends WithRef {
  readonly user: string
  readonly id: string
}

export interface ExtendInput extends WithRef {
  readonly user: string
  readonly id: string
  readonly ttlMs: number
}

export interface AdjustInput extends WithRef {
  readonly user: string
  readonly meter: string
  /** Signed: a direct charge when positive, a refund when negative. */
  readonly amount: number
  readonly id: string
}

export interface AcquireSlotInput extends WithRef {
  /** Empty for a system job, which is always `acquired` and counts against nothing. */
  readonly user: string
  readonly job: string
  readonly leaseMs?: number
  /** How long to wait in the user's FIFO queue before answering `busy`; default 0. */
  readonly waitMs?: number
}

export interface RenewSlotInput extends WithRef {
  readonly user: string
  readonly job: string
  readonly leaseMs?: number
}

export interface ReleaseSlotInput extends WithRef {
  readonly user: string
  readonly job: string
}

export interface GetUsageInput extends WithRef {
  readonly user: string
}

export interface ListHoldsInput extends WithRef {
  readonly user: string
  /** `pending` (default), `closed` (still remembered) or `all`. */
  readonly state?: "pending" | "closed" | "all"
  /** At most this many, oldest first: 1 to 1 000, default 100. */
  readonly limit?: number
}

export interface SetPlanInput extends WithRef {
  readonly user: string
  readonly plan: string
}

export interface SetLimitInput extends WithRef {
  readonly user: string
  readonly meter: string
  /** A per-user limit, or null to return to the plan's default. */
  readonly limit: number | null
}

/**
 * `usage_history` (revision 1.3, `.admin`): a user's `used` per past period, newest first. The user is
 * the method's first argument.
 */
export interface UsageHistoryOptions extends WithRef {
  /** One meter whose period is `month` or `day` (else `invalid_request`); default every such meter. */
  readonly meter?: string
  /** How many calendar periods back, the current one counted: 1 to 36, default 12. */
  readonly periods?: number
}

/**
 * `list_usage` (revision 1.3), sent to one partition's `.admin` subject with no user: every user of the
 * partition whose `used` in one period is above 0, by the users' UTF-8 bytes. The partition is the
 * method's first argument.
 */
export interface ListUsageOptions extends WithRef {
  readonly meter: string
  /**
   * The start (ms, UTC) of one of the meter's periods, not later than the current one: required for a
   * `month` or `day` meter, absent for a `none` meter (whose current value is listed).
   */
  readonly periodStart?: number
  /** List the users after this one (1 to 256 bytes): the last user of the previous page. */
  readonly after?: string
  /** At most this many users: 1 to 1 000, default 1 000. */
  readonly limit?: number
}

/** `usagePages`: the same as `list_usage` for every partition, paged until each answers `more: false`. */
export type UsagePagesOptions = Omit<ListUsageOptions, "after">

/** One page of `usagePages`: a `list_usage` answer of `partition`. */
export interface UsagePage {
  readonly partition: number
  readonly usage: UsageListResult["usage"]
  /** This partition has more pages after this one. */
  readonly more: boolean
}

/** A result as it comes off the wire: with the command's `ref` when it carried one. */
export type Echoed<R> = R & { readonly ref?: string }

/** Answers any command may get that say the call itself is wrong. */
export type CommandRejected = InvalidRequestResult | WrongPartitionResult

export type ReserveResult = Echoed<
  HoldResult | InsufficientQuotaResult | UnknownMeterResult | LimitReachedResult | CommandRejected
>
/** `consume`, `commit`, `release` and `extend` (only `consume` may answer `limit_reached`: bound `consume_keys`). */
export type HoldChangeResult = Echoed<HoldResult | NotFoundResult | LimitReachedResult | CommandRejected>
export type AdjustCommandResult = Echoed<AdjustResult | UnknownMeterResult | CommandRejected>
/** Slot commands (only `acquire_slot` may answer `limit_reached`: bounds `slot_waiters` and `slots`). */
export type SlotCommandResult = Echoed<SlotResult | LimitReachedResult | CommandRejected>
export type GetUsageResult = Echoed<UsageResult | CommandRejected>
export type ListHoldsResult = Echoed<HoldListResult | CommandRejected>
export type SetPlanResult = Echoed<OkResult | UnknownPlanResult | CommandRejected>
export type SetLimitResult = Echoed<OkResult | UnknownMeterResult | CommandRejected>
export type UsageHistoryCommandResult = Echoed<UsageHistoryResult | UnknownMeterResult | CommandRejected>
/** No user, so no `wrong_partition`: the subject names the partition. */
export type ListUsageResult = Echoed<UsageListResult | UnknownMeterResult | InvalidRequestResult>

/** A hold that `withHold` runs work under (`reserve` answered `reserved` or `exists`). */
export type GrantedHold = Echoed<HoldResult>

/** A slot that `withSlot` runs work in (`acquire_slot` answered `acquired` or `exists`). */
export type GrantedSlot = Echoed<SlotResult>
