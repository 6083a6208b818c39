/**
 * Invariants, asserted after every transition. A failure is a bug: it throws, the actor crashes and is
 * reloaded from the store, and the command is answered `unavailable`, never with a wrong grant.
 */
import { amountMax } from "./limits.js"
import type { Hold, UserState } from "./state.js"
import { holdReserved } from "./state.js"

export class InvariantViolation extends Error {
  override readonly name = "InvariantViolation"
}

export function assert(condition: boolean, message: string): asserts condition {
  if (!condition) throw new InvariantViolation(message)
}

const isAmount = (value: number): boolean => Number.isSafeInteger(value) && value >= 0 && value <= amountMax

/** Cheap checks of one meter, after every decision that touched it. */
export const assertMeter = (state: UserState, meter: string): void => {
  const meterState = state.meters.get(meter)
  if (meterState === undefined) return
  assert(isAmount(meterState.used), `${state.user}/${meter}: used ${meterState.used} is not an amount`)
  assert(
    isAmount(meterState.reserved),
    `${state.user}/${meter}: reserved ${meterState.reserved} is not an amount`
  )
  assert(
    Number.isSafeInteger(meterState.pendingHolds) && meterState.pendingHolds >= 0,
    `${state.user}/${meter}: pendingHolds ${meterState.pendingHolds}`
  )
}

/** A grant (a new hold) must leave the meter within its limit. */
export const assertGrantWithinLimit = (state: UserState, meter: string, limit: number): void => {
  const meterState = state.meters.get(meter)
  assert(meterState !== undefined, `${state.user}/${meter}: granted without a meter state`)
  assert(
    meterState.used + meterState.reserved <= limit,
    `${state.user}/${meter}: grant left used ${meterState.used} + reserved ${meterState.reserved} > limit ${limit}`
  )
}

/** A slot grant must leave the user within its plan's slots. */
export const assertSlotsWithinLimit = (state: UserState, limit: number | null): void => {
  if (limit === null) return
  assert(
    state.slots.size <= limit,
    `${state.user}: slot grant left ${state.slots.size} held > limit ${limit}`
  )
}

/**
 * Full recount: the per-meter aggregates equal what the holds say, and the expiry bounds are below every
 * hold's and lease's end. O(holds + slots); run where cost allows (tests, load).
 */
export const assertUserState = (state: UserState): void => {
  const recount = new Map<string, { reserved: number; pendingHolds: number }>()
  for (const hold of state.pending.values()) {
    assert(hold.state === "pending", `${state.user}/${hold.id}: ${hold.state} hold among pending`)
    assert(isAmount(hold.amount) && isAmount(hold.consumed), `${state.user}/${hold.id}: amounts`)
    assert(
      state.pendingExpiresAtLowest <= hold.expiresAt,
      `${state.user}/${hold.id}: expires at ${hold.expiresAt}, before the lowest bound ${state.pendingExpiresAtLowest}`
    )
    const entry = recount.get(hold.meter) ?? { reserved: 0, pendingHolds: 0 }
    entry.reserved += holdReserved(hold)
    entry.pendingHolds += 1
    recount.set(hold.meter, entry)
  }
  for (const hold of state.closed.values()) {
    assert(hold.state !== "pending", `${state.user}/${hold.id}: pending hold among closed`)
    assert(!state.pending.has(hold.id), `${state.user}/${hold.id}: both pending and closed`)
  }
  // The list is in the order the holds closed, not checked against closedAt: a clock that steps back
  // (or a new owner's clock behind the last one's) closes a hold "earlier" after a later one.
  let inOrder = 0
  let newest: Hold | null = null
  for (let hold = state.closedOldest; hold !== null; hold = hold.closedNext) {
    assert(state.closed.get(hold.id) === hold, `${state.user}/${hold.id}: in closing order, not among closed`)
    newest = hold
    inOrder += 1
    if (inOrder > state.closed.size) break
  }
  assert(
    inOrder === state.closed.size && newest === state.closedNewest,
    `${state.user}: ${state.closed.size} closed holds, ${inOrder} in closing order (or its newest misplaced)`
  )
  for (const [job, leaseExpiresAt] of state.slots) {
    assert(
      state.slotsLeaseExpiresAtLowest <= leaseExpiresAt,
      `${state.user}/${job}: lease ends at ${leaseExpiresAt}, before the lowest bound ${state.slotsLeaseExpiresAtLowest}`
    )
  }
  for (const [meter, meterState] of state.meters) {
    assertMeter(state, meter)
    const expected = recount.get(meter) ?? { reserved: 0, pendingHolds: 0 }
    assert(
      meterState.reserved === expected.reserved && meterState.pendingHolds === expected.pendingHolds,
      `${state.user}/${meter}: reserved ${meterState.reserved}/${meterState.pendingHolds} holds, recount ${expected.reserved}/${expected.pendingHolds}`
    )
  }
}
