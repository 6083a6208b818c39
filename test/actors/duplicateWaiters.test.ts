/**
 * Issue 20, item 1: copies of one waiting `acquire_slot` (same user, same job) must not each be parked.
 * PROTOCOL.md revision 1.2: a repeated acquire of a waiting job replaces the earlier request as the
 * waiter, and the earlier request is answered `busy` at once, so a user's waiting jobs hold at most one
 * request each. Before, every copy was parked with its whole message until the slot freed (memory grew
 * with the copies, without bound) and freeing the slot answered them all in one turn.
 */
import { setFlagsFromString } from "node:v8"
import { runInNewContext } from "node:vm"
import { describe, expect, it } from "vitest"
import type { Command } from "../../src/domain/commands.js"
import { defaultConfig } from "../../src/domain/config.js"
import type { Result } from "../../src/domain/results.js"
import { makeMemoryStore } from "../../src/store/MemoryStore.js"
import { flushTurns, startCoordinator, within } from "../support/harness.js"

setFlagsFromString("--expose-gc")
const gc = runInNewContext("gc") as () => void
const heapUsedAfterGc = (): number => {
  gc()
  gc()
  return process.memoryUsage().heapUsed
}

const startAt = Date.UTC(2026, 2, 10, 12)
const acquire = (job: string, waitMs: number): Command => ({
  op: "acquire_slot",
  user: "u",
  job,
  leaseMs: 60_000,
  waitMs
})

describe("copies of a waiting acquire_slot", () => {
  it("keep one request parked per job: each copy answers the one before it busy at once", async () => {
    const harness = await startCoordinator({ config: defaultConfig, store: makeMemoryStore(), startAt })
    try {
      // The free plan's only slot is taken; every copy below waits for it.
      expect((await harness.send(acquire("holder", 0))).status).toBe("acquired")
      const copies = 40_000
      const chunk = 2_000
      const answers = new Map<string, number>()
      let last: Result | undefined
      const heapBefore = heapUsedAfterGc()
      for (let sent = 0; sent < copies; sent += chunk) {
        for (let index = 0; index < chunk; index += 1) {
          const isLast = sent + index === copies - 1
          harness.coordinator.enqueue(acquire("w", 300_000), (result) => {
            if (isLast) last = result
            else answers.set(result.status, (answers.get(result.status) ?? 0) + 1)
          })
        }
        // The actor decides the chunk (its mailbox holds 4 096) before the next one comes.
        await flushTurns(5)
      }
      const heapGrowth = heapUsedAfterGc() - heapBefore
      const answeredAtOnce = [...answers.values()].reduce((sum, count) => sum + count, 0)
      console.log(
        `${copies} copies of one waiting acquire_slot: ${answeredAtOnce} answered before the slot freed ` +
          `(${JSON.stringify(Object.fromEntries(answers))}), heap +${(heapGrowth / 1_048_576).toFixed(1)} MB`
      )
      // Every copy but the last was answered busy at once; only the last one waits.
      expect(Object.fromEntries(answers)).toEqual({ busy: copies - 1 })
      expect(last).toBeUndefined()
      const usage = await harness.send({ op: "get_usage", user: "u" })
      expect(usage).toMatchObject({ slots: { held: 1, waiting: 1 } })
      // Nothing per copy stays: what is left is the one parked request and noise.
      expect(heapGrowth).toBeLessThan(2 * 1_048_576)

      // Freeing the slot hands it to the one waiting request, in one short turn.
      const startedAt = performance.now()
      const released = await harness.send({ op: "release_slot", user: "u", job: "holder" })
      const tookMs = performance.now() - startedAt
      console.log(`release_slot with the copies parked: answered in ${tookMs.toFixed(1)} ms`)
      expect(released.status).toBe("released")
      await flushTurns(5)
      expect(last).toMatchObject({ status: "acquired", job: "w", held: 1 })
      expect(Object.fromEntries(answers)).toEqual({ busy: copies - 1 })
      expect(tookMs).toBeLessThan(100)
    } finally {
      await harness.close()
    }
  })

  it("the repeated request's own waitMs applies: a shorter one ends the wait sooner", async () => {
    const harness = await startCoordinator({ config: defaultConfig, store: makeMemoryStore(), startAt })
    try {
      expect((await harness.send(acquire("holder", 0))).status).toBe("acquired")
      const first = harness.fire(acquire("w", 300_000))
      await flushTurns(5)
      expect(first.settled()).toBe(false)
      const second = harness.fire(acquire("w", 2_000))
      await flushTurns(5)
      expect(first.value()?.status).toBe("busy")
      expect(second.settled()).toBe(false)
      await harness.advance(2_000)
      const answered = await within(second.promise, 5_000, "the second request's wait running out")
      expect(answered.status).toBe("busy")
      expect(harness.errors).toEqual([])
    } finally {
      await harness.close()
    }
  })
})
