/**
 * Closed holds are remembered for `idRetentionMs` and at most `closedHoldsPerUserMax` per user
 * (limits.ts): a retry of a remembered id is answered from it; past either bound the oldest is
 * forgotten first, and a retry of a forgotten id is decided as new.
 */
import { describe, expect, it } from "vitest"
import { clockSkewMaxMs, defaultConfig } from "../../src/domain/config.js"
import { decide } from "../../src/domain/decide.js"
import { assertUserState } from "../../src/domain/invariants.js"
import { closedHoldsPerUserMax, idRetentionMs } from "../../src/domain/limits.js"
import type { Command } from "../../src/domain/commands.js"
import { emptyUserState, nextDeadline } from "../../src/domain/state.js"
import type { UserState } from "../../src/domain/state.js"
import { commit, reserve, setLimit, T0, tick, U } from "./support.js"

/** Decides `command` at T0 + `atMs` on `state`, without the full recount (some runs are long). */
const decideAt = (state: UserState, atMs: number, command: Command) =>
  decide(state, command, { config: defaultConfig, now: T0 + atMs, random: () => 0.5 }).result

/** Reserves and commits `count` holds `prefix0..`, the i-th closing at T0 + i ms. */
const closeHolds = (state: UserState, prefix: string, count: number, fromMs = 0): void => {
  for (let index = 0; index < count; index += 1) {
    expect(decideAt(state, fromMs + index, reserve(`${prefix}${index}`, 1))?.status).toBe("reserved")
    expect(decideAt(state, fromMs + index, commit(`${prefix}${index}`, 1))?.status).toBe("committed")
  }
}

const newState = (): UserState => {
  const state = emptyUserState(U)
  decideAt(state, 0, setLimit("analysis", Number.MAX_SAFE_INTEGER))
  return state
}

describe("closed holds remembered", () => {
  it("a retry within the retention window is answered from the closed hold (a commit again: exists)", () => {
    const state = newState()
    closeHolds(state, "h", 3)
    expect(decideAt(state, idRetentionMs - 1, commit("h0", 1))?.status).toBe("exists")
    assertUserState(state)
  })

  it("past the retention window the oldest are forgotten, in closing order, and the rest kept", () => {
    const state = newState()
    // Thousands forgotten at once, from the front of the closing order.
    closeHolds(state, "h", 3_000)
    // At this time, holds that closed at T0 + 0 .. T0 + 2 499 are past the window.
    const atMs = idRetentionMs + 2_500
    expect(decideAt(state, atMs, commit("h2499", 1))?.status).toBe("not_found")
    expect(decideAt(state, atMs, commit("h2500", 1))?.status).toBe("exists")
    expect(decideAt(state, atMs, commit("h2999", 1))?.status).toBe("exists")
    expect(state.closed.size).toBe(500)
    assertUserState(state)
  })

  it("everything forgotten leaves no closed hold, and new ones are remembered again", () => {
    const state = newState()
    closeHolds(state, "h", 10)
    closeHolds(state, "k", 2, idRetentionMs + 10)
    expect(state.closed.size).toBe(2)
    expect(decideAt(state, idRetentionMs + 20, commit("h9", 1))?.status).toBe("not_found")
    expect(decideAt(state, idRetentionMs + 20, commit("k1", 1))?.status).toBe("exists")
    assertUserState(state)
  })

  it(`past ${closedHoldsPerUserMax} closed holds the oldest is forgotten before its retention ends`, () => {
    const state = newState()
    closeHolds(state, "h", closedHoldsPerUserMax + 3)
    expect(state.closed.size).toBe(closedHoldsPerUserMax)
    const atMs = closedHoldsPerUserMax + 10
    expect(decideAt(state, atMs, commit("h2", 1))?.status).toBe("not_found")
    expect(decideAt(state, atMs, commit("h3", 1))?.status).toBe("exists")
    assertUserState(state)
  })
})

describe("the pending holds' expiry bound", () => {
  // Expiries fall due this long after their instants (0 with one clock, as here).
  const skewMs = clockSkewMaxMs(defaultConfig)
  it("a user whose holds all closed has nothing due (no tick for a hold that is gone)", () => {
    const state = newState()
    expect(decideAt(state, 0, reserve("h1", 1))?.status).toBe("reserved")
    expect(nextDeadline(defaultConfig, state)).toBe(T0 + 60_000 + skewMs)
    expect(decideAt(state, 1_000, commit("h1", 1))?.status).toBe("committed")
    expect(nextDeadline(defaultConfig, state)).toBeNull()
  })

  it("with holds still pending, the next deadline is never later than the earliest expiry", () => {
    const state = newState()
    decideAt(state, 0, reserve("early", 1))
    decideAt(state, 10, reserve("late", 1, "analysis", 120_000))
    decideAt(state, 20, commit("early", 1))
    const deadline = nextDeadline(defaultConfig, state)
    expect(deadline).not.toBeNull()
    expect(deadline!).toBeLessThanOrEqual(T0 + 10 + 120_000 + skewMs)
    // A tick at the stale bound expires nothing and makes it exact.
    expect(decideAt(state, 60_000 + skewMs, tick())).toBeNull()
    expect(nextDeadline(defaultConfig, state)).toBe(T0 + 10 + 120_000 + skewMs)
  })
})
