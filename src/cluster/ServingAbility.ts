/**
 * Ownership follows the ability to serve: a process that holds partitions it cannot serve leaves them
 * unserved for as long as it cannot, while its ownership pool renews their leases. So each way of not
 * being able to serve bounds itself (docs/SCALING.md "Ownership follows the ability to serve"):
 *
 * - cut off from the transport (NATS) past natsLossGraceMs, a clock beyond the bound, or a store that
 *   fails its checks past the grace: the process gives every partition up (steps down, releases the
 *   leases, heartbeats as leaving) and claims its share again once it can serve;
 * - a step-down that has run past the grace (its requests in flight wait on something stuck): the
 *   process may not claim those partitions back before it ends, so it says it cannot take its share
 *   (heartbeats as leaving, releases the leases it no longer serves) and the others' counts cover it.
 *
 * The decisions are pure functions of what the state records; the watch of the store is the only loop.
 */
import { Cause, Effect, Exit } from "effect"
import {
  servingLossGraceMsMin,
  servingLossGraceShareOfLease,
  storeCheckIntervalMs
} from "../domain/limits.js"
import type { OwnershipOptions, OwnershipState } from "./OwnershipState.js"

/**
 * How long a failing store or a running step-down is borne before the process stops counting on
 * itself: a third of the lease, at least servingLossGraceMsMin. With the check's interval and a round
 * after it, the others serve the partitions within a lease and a round of the fault.
 */
export const servingLossGraceMs = (leaseMs: number): number =>
  Math.max(servingLossGraceMsMin, Math.floor(leaseMs * servingLossGraceShareOfLease))

/** Whether the transport has been unreachable for longer than the grace. */
export const transportAway = (options: OwnershipOptions, nowMs: number = performance.now()): boolean => {
  const since = options.state.transportDownSince
  return (
    options.transportLossGraceMs !== undefined &&
    since !== undefined &&
    nowMs - since >= options.transportLossGraceMs
  )
}

/**
 * The transport went down (`up` false) or came back: recorded, and the loop woken when it matters (at
 * the end of the grace, if still down; at once when back, to claim again).
 */
export const transportChanged = (options: OwnershipOptions, up: boolean): void => {
  const { state } = options
  if (up) {
    if (state.transportDownSince === undefined) return
    state.transportDownSince = undefined
    state.wake()
    return
  }
  if (state.transportDownSince !== undefined) return
  const since = performance.now()
  state.transportDownSince = since
  const grace = options.transportLossGraceMs
  if (grace === undefined) return
  setTimeout(() => {
    if (state.transportDownSince === since) state.wake()
  }, grace).unref()
}

/** Why a round gives every partition up now (the first that holds), or undefined: it can serve. */
export const givingUpReason = (reasons: {
  readonly transportAway: boolean
  readonly clockBeyond: string | undefined
  readonly storeFailed: boolean
}): string | undefined => {
  if (reasons.transportAway) return "cut off from the transport (NATS)"
  if (reasons.clockBeyond !== undefined) return reasons.clockBeyond
  if (reasons.storeFailed) return "its store fails its checks (loads and writes cannot be served)"
  return undefined
}

/**
 * Whether the store has failed its checks for the grace while the member lock was held: a store that
 * failed while the lock was lost too (a failover ends every session) counts from the lock's return.
 */
export const storeFailed = (state: OwnershipState, graceMs: number, nowMs: number): boolean =>
  state.storeFailedSince !== undefined &&
  nowMs - Math.max(state.storeFailedSince, state.memberLockHeldSince) >= graceMs

/** The partitions whose step-down has run for at least `graceMs` by `nowMs`, in order. */
export const stuckStepDowns = (
  steppingDownSince: ReadonlyMap<number, number>,
  nowMs: number,
  graceMs: number
): Array<number> =>
  [...steppingDownSince]
    .filter(([, since]) => nowMs - since >= graceMs)
    .map(([partition]) => partition)
    .sort((left, right) => left - right)

/** A check passed: a store marked failed is back (the loop is woken to claim again). */
const storePassed = (options: OwnershipOptions): void => {
  const { state } = options
  if (state.storeFailedSince === undefined) return
  state.storeFailedSince = undefined
  options.onStoreChange?.(undefined)
  state.wake()
}

/**
 * Checks the store every storeCheckIntervalMs while the loop runs: one check at a time, each waited
 * for the grace at most (a stuck pool answers nothing). No check passed for the grace: the store is
 * marked failed and the loop woken, so that the round gives everything up at once.
 */
export const watchStore = (
  options: OwnershipOptions,
  check: Effect.Effect<void, unknown>
): Effect.Effect<void> =>
  Effect.gen(function* () {
    const { state } = options
    const graceMs = servingLossGraceMs(options.leaseMs)
    let lastPassedAt = performance.now()
    while (!state.leaving) {
      const exit = yield* Effect.exit(Effect.timeout(check, graceMs))
      const now = performance.now()
      if (Exit.isSuccess(exit)) {
        lastPassedAt = now
        storePassed(options)
      } else if (state.storeFailedSince === undefined && now - lastPassedAt >= graceMs) {
        state.storeFailedSince = lastPassedAt
        options.onStoreChange?.(String(Cause.squash(exit.cause)))
        state.wake()
      }
      yield* Effect.sleep(storeCheckIntervalMs)
    }
  })
