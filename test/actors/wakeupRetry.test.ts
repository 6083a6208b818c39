/**
 * A waiter's retry decided in the same group as the wakeup that times its first wait out: the domain
 * answers the first wait `busy` and queues the retry as a new waiter. The retry must wait for a
 * wakeup of its own. Answered with the first wait's `busy` instead, its caller would walk away while
 * the domain later grants the job the slot: a slot held by nobody who knows it, until its lease ends.
 */
import { describe, expect, it } from "vitest"
import type { Command } from "../../src/domain/commands.js"
import { defaultConfig } from "../../src/domain/config.js"
import { makeMemoryStore } from "../../src/store/MemoryStore.js"
import { flushTurns, startCoordinator, within } from "../support/harness.js"

const startAt = Date.UTC(2026, 2, 10, 12)
const acquire = (job: string, waitMs: number): Command => ({
  op: "acquire_slot",
  user: "u",
  job,
  leaseMs: 60_000,
  waitMs
})

describe("a retry of a waiter in the group that times out its first wait", () => {
  it("waits for a wakeup of its own, and gets the slot when it frees", async () => {
    // A write the test holds, so the timeout's tick and the retry queue up and are decided together.
    let hold: (() => void) | undefined
    let holding = false
    const store = makeMemoryStore({
      beforeWrite: () =>
        holding
          ? new Promise<void>((resolve) => {
              hold = resolve
            })
          : Promise.resolve()
    })
    const harness = await startCoordinator({ config: defaultConfig, store, startAt })
    try {
      // The default plan (free) has one slot: A takes it, J waits for it for 1 s.
      expect((await harness.send(acquire("A", 0))).status).toBe("acquired")
      const first = harness.fire(acquire("J", 1_000))
      await flushTurns(10)
      expect(first.settled()).toBe(false)

      holding = true
      harness.fire({ op: "reserve", user: "u", meter: "tokens", amount: 1, id: "h", ttlMs: 60_000 })
      await flushTurns(10)
      await harness.advance(1_000)
      const retry = harness.fire(acquire("J", 10_000))
      holding = false
      hold?.()
      await flushTurns(20)

      expect(first.value()?.status).toBe("busy")
      expect(retry.settled(), `the retry was answered ${JSON.stringify(retry.value())}`).toBe(false)

      expect((await harness.send({ op: "release_slot", user: "u", job: "A" })).status).toBe("released")
      const granted = await within(retry.promise, 5_000, "the retry's wakeup")
      expect(granted.status).toBe("acquired")
    } finally {
      await harness.close()
    }
  })
})
