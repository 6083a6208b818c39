/**
 * PROTOCOL.md revision 1.2's per-user bounds over the pure `decide`: past each, `limit_reached` with
 * `bound` and `max` and nothing changed; a repeat of what is already there is still answered as before
 * (`exists`), and freeing what the bound counts makes room again. Also: with fairness off, a decision's
 * cost does not grow with the slots a user holds (issue 20, item 5).
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
  slotWaitersPerUserMax,
  slotsPerUserMax
} from "../../src/domain/limits.js"
import type { Result } from "../../src/domain/results.js"
import type { UserState } from "../../src/domain/state.js"
import { emptyUserState } from "../../src/domain/state.js"
import { acquire, commit, consume, releaseSlot, renew, reserve, T0, U } from "./support.js"

const fairnessOff: Config = { ...defaultConfig, fairness: { ...defaultConfig.fairness, enabled: false } }
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

  it(`slots: with fairness off, a new job past ${slotsPerUserMax} slots; held jobs still renew and exist`, () => {
    const state = emptyUserState(U)
    for (let index = 0; index < slotsPerUserMax; index += 1)
      expect(decideOn(state, acquire(`j${index}`), fairnessOff)?.status).toBe("acquired")
    const past = decide(state, acquire("one-more"), ctxAt(fairnessOff))
    expect(past.result).toEqual({ status: "limit_reached", bound: "slots", max: slotsPerUserMax })
    expect(past.events).toEqual([])
    expect(decideOn(state, acquire("j3"), fairnessOff)?.status).toBe("exists")
    expect(decideOn(state, renew("j4"), fairnessOff)?.status).toBe("renewed")
    expect(decideOn(state, releaseSlot("j5"), fairnessOff)?.status).toBe("released")
    expect(decideOn(state, acquire("one-more"), fairnessOff)?.status).toBe("acquired")
  })

  it("slots: the bound holds with fairness on too, for a plan configured with more slots", () => {
    const many: Config = {
      ...defaultConfig,
      plans: { ...defaultConfig.plans, free: { ...defaultConfig.plans["free"]!, slots: 1_000_000 } }
    }
    const state = emptyUserState(U)
    for (let index = 0; index < slotsPerUserMax; index += 1)
      expect(decideOn(state, acquire(`j${index}`), many)?.status).toBe("acquired")
    expect(decideOn(state, acquire("one-more", { waitMs: 60_000 }), many)).toEqual({
      status: "limit_reached",
      bound: "slots",
      max: slotsPerUserMax
    })
  })
})

describe("a decision's cost with many slots held (fairness off)", () => {
  /** Counts every walk over the state's slot collection (iteration, spread, forEach). */
  const countWalks = (state: UserState): { walks: number } => {
    const counter = { walks: 0 }
    const slots = state.slots as Map<string, number>
    for (const method of ["entries", "keys", "values", "forEach", Symbol.iterator] as const) {
      const original = slots[method] as (...args: Array<unknown>) => unknown
      Object.defineProperty(slots, method, {
        configurable: true,
        value: (...args: Array<unknown>) => {
          counter.walks += 1
          return original.apply(slots, args)
        }
      })
    }
    return counter
  }

  it("renew_slot, reserve and a tick walk none of the slots when no lease is due", () => {
    const state = emptyUserState(U)
    for (let index = 0; index < slotsPerUserMax; index += 1)
      decideOn(state, acquire(`j${index}`, { leaseMs: 600_000 }), fairnessOff)
    const counter = countWalks(state)
    for (let index = 0; index < 1_000; index += 1) {
      const now = T0 + index
      expect(decideOn(state, renew(`j${index % slotsPerUserMax}`, 600_000), fairnessOff, now)?.status).toBe(
        "renewed"
      )
    }
    expect(decideOn(state, reserve("h", 1), fairnessOff, T0 + 1_000)?.status).toBe("reserved")
    expect(decideOn(state, { op: "tick", user: U }, fairnessOff, T0 + 1_000)).toBeNull()
    expect(counter.walks).toBe(0)
  })

  it("10 000 jobs acquired (the excess refused), then 1 000 renew_slot take well under 100 ms", () => {
    const state = emptyUserState(U)
    for (let index = 0; index < 10_000; index += 1)
      decideOn(state, acquire(`j${index}`, { leaseMs: 600_000 }), fairnessOff)
    const startedAt = performance.now()
    for (let index = 0; index < 1_000; index += 1)
      decideOn(state, renew(`j${index % slotsPerUserMax}`, 600_000), fairnessOff, T0 + index)
    const tookMs = performance.now() - startedAt
    console.log(`1 000 renew_slot at ${state.slots.size} slots held: ${tookMs.toFixed(1)} ms`)
    expect(state.slots.size).toBe(slotsPerUserMax)
    expect(tookMs).toBeLessThan(100)
  })

  it("a lease that ends is still freed, exactly when due, after many renewals moved the others", () => {
    const state = emptyUserState(U)
    decideOn(state, acquire("short", { leaseMs: 5_000 }), fairnessOff)
    decideOn(state, acquire("long", { leaseMs: 600_000 }), fairnessOff)
    decideOn(state, renew("short", 10_000), fairnessOff, T0 + 1_000)
    expect(decide(state, { op: "tick", user: U }, ctxAt(fairnessOff, T0 + 10_999)).events).toEqual([])
    const due = decide(state, { op: "tick", user: U }, ctxAt(fairnessOff, T0 + 11_000))
    expect(due.events.filter((event) => event.kind === "slot_freed")).toEqual([
      { kind: "slot_freed", user: U, job: "short", reason: "expired" }
    ])
    expect([...state.slots.keys()]).toEqual(["long"])
  })
})
