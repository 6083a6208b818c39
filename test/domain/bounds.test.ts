/**
 * PROTOCOL.md revision 1.2's per-user bounds over the pure `decide`: past each, `limit_reached` with
 * `bound` and `max` and nothing changed; a repeat of what is already there is still answered as before
 * (`exists`), and freeing what the bound counts makes room again.
 */
import { describe, expect, it } from "vitest"
import type { Command } from "../../src/domain/commands.js"
import type { Config } from "../../src/domain/config.js"
import { defaultConfig } from "../../src/domain/config.js"
import type { DecideContext } from "../../src/domain/context.js"
import { decide } from "../../src/domain/decide.js"
import { assertUserState } from "../../src/domain/invariants.js"
import {
  consumeKeysPerHoldMax,
  pendingHoldsPerUserMax,
  slotWaitersPerUserMax
} from "../../src/domain/limits.js"
import type { Result } from "../../src/domain/results.js"
import type { UserState } from "../../src/domain/state.js"
import { emptyUserState } from "../../src/domain/state.js"
import { acquire, commit, consume, reserve, T0, U } from "./support.js"

const ctxAt = (config: Config, now = T0): DecideContext => ({ config, now, random: () => 0.5 })

/** Decides without the per-decision recount (O(holds) each: quadratic over thousands of setup steps). */
const decideOn = (state: UserState, command: Command, config = defaultConfig, now = T0): Result | null =>
  decide(state, command, ctxAt(config, now)).result

describe("per-user bounds answer limit_reached", () => {
  it(`pending_holds: a new id past ${pendingHoldsPerUserMax} pending holds; a known id still decides first`, () => {
    const state = emptyUserState(U)
    for (let index = 0; index < pendingHoldsPerUserMax; index += 1)
      expect(decideOn(state, reserve(`h${index}`, 0))?.status).toBe("reserved")
    const past = decide(state, reserve("one-more", 0), ctxAt(defaultConfig))
    expect(past.result).toEqual({
      status: "limit_reached",
      bound: "pending_holds",
      max: pendingHoldsPerUserMax
    })
    expect(past.events).toEqual([])
    expect(decideOn(state, reserve("h7", 0))?.status).toBe("exists")
    expect(decideOn(state, reserve("one-more", 0))?.status).toBe("limit_reached")
    expect(decideOn(state, commit("h7"))?.status).toBe("committed")
    expect(decideOn(state, reserve("one-more", 0))?.status).toBe("reserved")
    assertUserState(state)
  })

  it(`consume_keys: a new key past ${consumeKeysPerHoldMax} on one hold; an applied key is still exists`, () => {
    const state = emptyUserState(U)
    expect(decideOn(state, reserve("h", 10))?.status).toBe("reserved")
    for (let index = 0; index < consumeKeysPerHoldMax; index += 1)
      expect(decideOn(state, consume("h", 0, `k${index}`))?.status).toBe("consumed")
    const past = decide(state, consume("h", 1, "one-more"), ctxAt(defaultConfig))
    expect(past.result).toEqual({
      status: "limit_reached",
      bound: "consume_keys",
      max: consumeKeysPerHoldMax
    })
    expect(past.events).toEqual([])
    expect(decideOn(state, consume("h", 0, "k9"))?.status).toBe("exists")
    expect(decideOn(state, commit("h", 1))?.status).toBe("committed")
    assertUserState(state)
  })

  it(`slot_waiters: a new job past ${slotWaitersPerUserMax} waiting; a waiting job's repeat replaces it`, () => {
    const state = emptyUserState(U)
    expect(decideOn(state, acquire("holder"))?.status).toBe("acquired")
    for (let index = 0; index < slotWaitersPerUserMax; index += 1)
      expect(decideOn(state, acquire(`w${index}`, { waitMs: 60_000 }))).toBeNull()
    const past = decide(state, acquire("one-more", { waitMs: 60_000 }), ctxAt(defaultConfig))
    expect(past.result).toEqual({
      status: "limit_reached",
      bound: "slot_waiters",
      max: slotWaitersPerUserMax
    })
    expect(past.wakeups).toEqual([])
    // The same job again is not a new waiter: it replaces the earlier request, answered busy.
    const repeat = decide(state, acquire("w5", { waitMs: 60_000 }), ctxAt(defaultConfig))
    expect(repeat.result).toBeNull()
    expect(repeat.wakeups.map((wakeup) => [wakeup.job, wakeup.result.status])).toEqual([["w5", "busy"]])
    expect(state.waiters.length).toBe(slotWaitersPerUserMax)
  })
})
