/**
 * Commands as the domain sees them: validated, defaults applied (src/transport decodes the wire).
 * `ref` is not here: the transport echoes it and the decision never reads it.
 */
import type { PeriodUsage } from "./events.js"

export type OpsCommand =
  | {
      readonly op: "reserve"
      readonly user: string
      readonly meter: string
      readonly amount: number
      readonly id: string
      readonly ttlMs: number
    }
  | {
      readonly op: "consume"
      readonly user: string
      readonly id: string
      readonly amount: number
      readonly key: string
    }
  | { readonly op: "commit"; readonly user: string; readonly id: string; readonly amount: number | undefined }
  | { readonly op: "release"; readonly user: string; readonly id: string }
  | { readonly op: "extend"; readonly user: string; readonly id: string; readonly ttlMs: number }
  | {
      readonly op: "adjust"
      readonly user: string
      readonly meter: string
      readonly amount: number
      readonly id: string
    }
  | {
      readonly op: "acquire_slot"
      readonly user: string
      readonly job: string
      readonly leaseMs: number
      readonly waitMs: number
    }
  | { readonly op: "renew_slot"; readonly user: string; readonly job: string; readonly leaseMs: number }
  | { readonly op: "release_slot"; readonly user: string; readonly job: string }
  | { readonly op: "get_usage"; readonly user: string }

export type AdminCommand =
  | { readonly op: "set_plan"; readonly user: string; readonly plan: string }
  | { readonly op: "set_limit"; readonly user: string; readonly meter: string; readonly limit: number | null }
  | { readonly op: "get_usage"; readonly user: string }
  | {
      readonly op: "list_holds"
      readonly user: string
      readonly state: HoldListState
      /** At most this many holds, oldest first. */
      readonly limit: number
    }
  | UsageHistoryCommand

/**
 * Revision 1.3: a user's `used` per past period. `meters`: those asked about (one, or every meter whose
 * period is `month` or `day`), checked against the configuration by the decision.
 */
export interface UsageHistoryCommand {
  readonly op: "usage_history"
  readonly user: string
  /** The meter asked about; undefined: every meter with a period. */
  readonly meter: string | undefined
  readonly periods: number
  /**
   * The stored rows of the meters' latest periods with usage (at most `periods` each, newest first),
   * read by the actor just before it decides; never on the wire.
   */
  readonly past?: ReadonlyArray<PeriodUsage>
}

/**
 * Revision 1.3: one page of a partition's users' `used` in one period. Sent to a partition's `.admin`
 * subject with no user, so it is not a `Command` (no actor decides it): the coordinator answers it
 * from the store, for a partition it serves.
 */
export interface ListUsageCommand {
  readonly op: "list_usage"
  readonly partition: number
  readonly meter: string
  /** Absent on the wire: null (a `none` meter's current value, or refused for a meter with a period). */
  readonly periodStart: number | null
  readonly after: string | undefined
  readonly limit: number
}

/** Which holds `list_holds` lists: pending ones, closed ones still remembered, or both. */
export type HoldListState = "pending" | "closed" | "all"

/** Sent by the actor's timer and the orphan sweep: expire whatever is due, answer nothing. */
export interface TickCommand {
  readonly op: "tick"
  readonly user: string
}

export type Command = OpsCommand | AdminCommand | TickCommand

export type Operation = Command["op"]
