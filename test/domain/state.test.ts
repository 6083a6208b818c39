import { describe, expect, it } from "vitest"
import { noReplyHandle } from "../../src/domain/context.js"
import type { Waiter } from "../../src/domain/state.js"
import { emptyUserState, writable, writableWaiters } from "../../src/domain/state.js"

describe("a user state's collections (shared empty sentinels until the first write)", () => {
  it("gives each state its own collection on the first write, leaving other states empty", () => {
    const alice = emptyUserState("alice")
    const bob = emptyUserState("bob")
    writable(alice, "slots").set("job-1", 1_000)
    writable(alice, "adjustments").set("adj-1", { meter: "tokens", amount: 5, at: 1 })
    writableWaiters(alice).push({ job: "job-2", leaseMs: 1_000, deadlineAt: 2_000, reply: noReplyHandle() })
    expect([...alice.slots]).toEqual([["job-1", 1_000]])
    expect(alice.adjustments.size).toBe(1)
    expect(alice.waiters).toHaveLength(1)
    for (const collection of [bob.meters, bob.pending, bob.closed, bob.adjustments, bob.slots]) {
      expect(collection.size).toBe(0)
    }
    expect(bob.waiters).toHaveLength(0)
  })

  it("returns the same collection on later writes", () => {
    const state = emptyUserState("alice")
    const first = writable(state, "pending")
    expect(writable(state, "pending")).toBe(first)
    expect(state.pending).toBe(first)
  })

  it("crashes on a write that bypasses writable(), rather than leaking into every user", () => {
    const state = emptyUserState("alice")
    expect(() => (state.slots as Map<string, number>).set("job", 1)).toThrow(/shared empty collection/)
    expect(() =>
      (state.waiters as Array<Waiter>).push({ job: "j", leaseMs: 1, deadlineAt: 1, reply: noReplyHandle() })
    ).toThrow(TypeError)
    expect(emptyUserState("bob").slots.size).toBe(0)
  })
})
