/**
 * Events: what a decision asks the store to make durable, as images of the rows they change.
 * The store applies them in order; a later image of the same row replaces an earlier one.
 */
import type { HoldState } from "./results.js"

export interface HoldRecord {
  readonly id: string
  readonly meter: string
  readonly amount: number
  /** Usage already moved from the hold; after `commit`, the work's final usage. */
  readonly consumed: number
  readonly state: HoldState
  readonly expiresAt: number
  readonly createdAt: number
  /** When it left `pending`; null while pending. */
  readonly closedAt: number | null
}

export type LedgerOperation = "consume" | "commit" | "adjust"

/**
 * What other systems hear about (PROTOCOL.md "Events"), as a decision decides it: the kind, the time of
 * the decision, and the kind's own fields. The store records it with the change it reports, in the
 * same transaction; the publisher adds `eventId`, `user` and `partition` when it sends it.
 */
export type QuotaEvent =
  | {
      readonly event: "usage_threshold"
      readonly at: number
      readonly meter: string
      readonly periodStart: number | null
      readonly threshold: number
      readonly limit: number
      readonly used: number
    }
  | {
      readonly event: "hold_expired"
      readonly at: number
      readonly meter: string
      readonly id: string
      readonly amount: number
      readonly consumed: number
      /** The unconsumed rest given back to the meter. */
      readonly returned: number
    }
  | { readonly event: "slot_expired"; readonly at: number; readonly job: string; readonly plan: string }
  | {
      readonly event: "plan_changed"
      readonly at: number
      readonly plan: string
      readonly previousPlan: string
    }
  | {
      readonly event: "limit_changed"
      readonly at: number
      readonly meter: string
      /** The override now stored; null: back to the plan's default. */
      readonly limit: number | null
    }
  | {
      /** Revision 1.3: a decision changed the meter's `used` (every change; their amounts add up to `used`). */
      readonly event: "usage_recorded"
      readonly at: number
      readonly meter: string
      /** The period the change counts in: the decision's. */
      readonly periodStart: number | null
      /** Signed: exactly how much `used` changed (a refund clamped at 0 records what it took back). */
      readonly amount: number
      /** `used` after the decision. */
      readonly used: number
      readonly source: LedgerOperation
      /** The hold id (`consume`, `commit`) or the `adjust` id. */
      readonly ref: string
      /** A `consume`'s key; absent otherwise. */
      readonly key?: string
    }

export type QuotaEventKind = QuotaEvent["event"]

/** Every kind, in PROTOCOL.md's order. */
export const quotaEventKinds: ReadonlyArray<QuotaEventKind> = [
  "usage_threshold",
  "hold_expired",
  "slot_expired",
  "plan_changed",
  "limit_changed",
  "usage_recorded"
]

export type StoreEvent =
  /** Insert or replace the hold (user, id). */
  | { readonly kind: "hold"; readonly user: string; readonly hold: HoldRecord }
  /**
   * Append one usage change. `delta` is what was applied to `used` (a refund clamped at 0 applies less
   * than asked); `requested` is what the command asked (adjust idempotency compares it). Unique by
   * (user, operation, holdId, key): for consume the consume key, for commit "", for adjust the adjust id.
   */
  | {
      readonly kind: "ledger"
      readonly user: string
      readonly meter: string
      readonly periodStart: number | null
      readonly operation: LedgerOperation
      readonly holdId: string | null
      readonly key: string
      readonly requested: number
      readonly delta: number
      readonly at: number
    }
  /**
   * Set the running total of (user, meter, periodStart): the sum of the ledger's deltas for it, and the
   * thresholds already crossed in that period (each announced once).
   */
  | {
      readonly kind: "usage"
      readonly user: string
      readonly meter: string
      readonly periodStart: number | null
      readonly used: number
      /** Absent: none. */
      readonly thresholdsCrossed?: ReadonlyArray<number>
    }
  /** Record an event to publish, in order after the user's earlier ones (the outbox). */
  | { readonly kind: "event"; readonly user: string; readonly event: QuotaEvent }
  /** Insert or replace the slot (user, job). */
  | { readonly kind: "slot"; readonly user: string; readonly job: string; readonly leaseExpiresAt: number }
  /** Delete the slot (user, job). */
  | {
      readonly kind: "slot_freed"
      readonly user: string
      readonly job: string
      readonly reason: "released" | "expired"
    }
  /** Set the user's plan. */
  | { readonly kind: "plan"; readonly user: string; readonly plan: string }
  /** The user's decisions have reached instant `at`: its period is the earliest current one from now on. */
  | { readonly kind: "period_floor"; readonly user: string; readonly at: number }
  /** Set (or with null, remove) the user's limit override of a meter. */
  | { readonly kind: "limit"; readonly user: string; readonly meter: string; readonly limit: number | null }

/** One user's `used` of one meter in one period, as stored (revision 1.3 `usage_history`). */
export interface PeriodUsage {
  readonly meter: string
  readonly periodStart: number | null
  readonly used: number
}

/** What the store hands an actor when it starts: everything its decisions need, as stored. */
export interface StoredUser {
  /** null: never set, the configuration's default plan applies. */
  readonly plan: string | null
  readonly limitOverrides: ReadonlyArray<{ readonly meter: string; readonly limit: number }>
  /** The latest usage row of each meter. A row of an earlier period counts as 0 now. */
  readonly usage: ReadonlyArray<{
    readonly meter: string
    readonly periodStart: number | null
    readonly used: number
    /** Absent in rows written before thresholds existed: none crossed. */
    readonly thresholdsCrossed?: ReadonlyArray<number>
  }>
  /** Pending holds, and closed holds whose closedAt is within the retention window, with their consume keys. */
  readonly holds: ReadonlyArray<HoldRecord & { readonly consumeKeys: ReadonlyArray<string> }>
  /** `adjust` ids within the retention window, with what they asked. */
  readonly adjustments: ReadonlyArray<{
    readonly id: string
    readonly meter: string
    readonly amount: number
    readonly at: number
  }>
  readonly slots: ReadonlyArray<{ readonly job: string; readonly leaseExpiresAt: number }>
  /**
   * The store holds closed holds or `adjust` ids of the retention window beyond those given (a load
   * reads the newest loadRememberedIdsPerUserMax of each): an id not given may still be remembered.
   */
  readonly idsTruncated?: boolean
  /** The latest instant the store knows a decision of the user was made at (null: none). */
  readonly periodFloorAt?: number | null
}

/** Closed holds and `adjust` ids the store remembers for a user, asked for by id (see Store.recall). */
export type RecalledIds = Pick<StoredUser, "holds" | "adjustments">

export const emptyStoredUser: StoredUser = {
  plan: null,
  limitOverrides: [],
  usage: [],
  holds: [],
  adjustments: [],
  slots: []
}
