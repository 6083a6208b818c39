/**
 * A write the store refuses (the events outbox full, a fenced epoch) answers `unavailable` and reloads;
 * what fell due in the state (here an expiry, whose event the store refuses) is decided again after
 * failedWriteRetryDelayMs, not at once: without the pause the actor loaded and wrote in a loop.
 */
import { describe, expect, it } from "vitest"
import { defaultConfig } from "../../src/domain/config.js"
import type { StoreEvent } from "../../src/domain/events.js"
import { failedWriteRetryDelayMs } from "../../src/domain/limits.js"
import { makeMemoryStore } from "../../src/store/MemoryStore.js"
import { flushTurns, startCoordinator } from "../support/harness.js"

describe("after a refused write", () => {
  it("tries what fell due again after a pause, and succeeds once the store takes it", async () => {
    let refuseEvents = true
    let attempts = 0
    const store = makeMemoryStore({
      beforeWrite: async (events: ReadonlyArray<StoreEvent>) => {
        if (!events.some((event) => event.kind === "event")) return
        attempts += 1
        if (refuseEvents) throw new Error("the events outbox of partition 3 is full")
      }
    })
    const startAt = Date.UTC(2026, 2, 10, 12)
    const harness = await startCoordinator({ config: defaultConfig, store, startAt })
    try {
      expect(
        (await harness.send({ op: "reserve", user: "u", meter: "tokens", amount: 5, id: "h", ttlMs: 1_000 }))
          .status
      ).toBe("reserved")
      await harness.advance(1_000)
      await flushTurns(20)
      expect(attempts).toBe(1)
      // Three more pauses: three more attempts, not a loop.
      for (let pause = 0; pause < 3; pause += 1) {
        await harness.advance(failedWriteRetryDelayMs)
        await flushTurns(20)
      }
      expect(attempts).toBe(4)
      expect(store.rows.get("u")?.holds.get("h")?.state).toBe("pending")

      refuseEvents = false
      await harness.advance(failedWriteRetryDelayMs)
      await flushTurns(20)
      expect(attempts).toBe(5)
      expect(store.rows.get("u")?.holds.get("h")?.state).toBe("expired")
      expect(store.rows.get("u")?.events.map((event) => event.event)).toEqual(["hold_expired"])
    } finally {
      await harness.close()
    }
  })
})
