/**
 * Commands as the domain sees them: validated, defaults applied (src/transport decodes the wire).
 * `ref` is not here: the transport echoes it and the decision never reads it.
 */

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

/** Which holds `list_holds` lists: pending ones, closed ones still remembered, or both. */
export type HoldListState = "pending" | "closed" | "all"

/** Sent by the actor's timer and the orphan sweep: expire whatever is due, answer nothing. */
export interface TickCommand {
  readonly op: "tick"
  readonly user: string
}

export type Command = OpsCommand | AdminCommand | TickCommand

export type Operation = Command["op"]
