/**
 * `withHold`: run a piece of work under a hold. Reserve first, so the work only starts when its
 * amount fits the user's limit; charge what the work actually used; give the hold back if it failed.
 */
import { HoldNotCommitted, HoldNotGranted, LimitReached } from "./errors.js"
import type {
  CommitInput,
  Echoed,
  GrantedHold,
  HoldChangeResult,
  ReleaseInput,
  ReserveInput,
  ReserveResult
} from "./types.js"
import type { HoldResult } from "../domain/results.js"

/** The reserve: `id` names the work, so a retried `withHold` of the same work finds its hold (`exists`). */
export type HoldInput = ReserveInput

/** What the work reports: the amount it actually used, alone or as `{ actual }` beside its own fields. */
export type HoldWorkDone = number | { readonly actual: number }

export type HoldWork<W extends HoldWorkDone> = (hold: GrantedHold) => Promise<W>

export interface HoldWorkOutcome<W> {
  /** What the work returned. */
  readonly value: W
  readonly hold: GrantedHold
  /** The commit's result: `committed`, or `exists` when this hold had already been committed. */
  readonly commit: Echoed<HoldResult>
}

/** The operations `withHold` needs; `QuotaClient` has them. */
export interface HoldOperations {
  reserve(input: ReserveInput): Promise<ReserveResult>
  commit(input: CommitInput): Promise<HoldChangeResult>
  release(input: ReleaseInput): Promise<HoldChangeResult>
}

export const actualOf = (done: HoldWorkDone): number => (typeof done === "number" ? done : done.actual)

/**
 * Throws `LimitReached` (with `bound` and `max`) when the reserve answers `limit_reached`,
 * `HoldNotGranted` (with the result: `insufficient_quota`, `conflict`, `closed`, ...) when it grants
 * nothing else, the work's own error after releasing the hold when the work throws, and
 * `HoldNotCommitted` when the commit is refused (the hold expired or was released while the work ran).
 */
export const withHold = async <W extends HoldWorkDone>(
  client: HoldOperations,
  input: HoldInput,
  work: HoldWork<W>
): Promise<HoldWorkOutcome<W>> => {
  const hold = await client.reserve(input)
  const { user, id } = input
  if (hold.status === "limit_reached") {
    throw new LimitReached({ op: "reserve", user, id, bound: hold.bound, max: hold.max, result: hold })
  }
  if (hold.status !== "reserved" && hold.status !== "exists")
    throw new HoldNotGranted({ user, id, result: hold })
  let value: W
  try {
    value = await work(hold)
  } catch (error) {
    // The work's error is what the caller needs. If the release fails as well, the hold still
    // expires at its ttl and returns its amount then.
    await client.release({ user, id }).catch(() => undefined)
    throw error
  }
  const actual = actualOf(value)
  const commit = await client.commit({ user, id, amount: actual })
  if (commit.status !== "committed" && commit.status !== "exists") {
    throw new HoldNotCommitted({ user, id, result: commit, actual })
  }
  return { value, hold, commit }
}
