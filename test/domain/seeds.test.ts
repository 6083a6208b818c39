/**
 * The seeds' scenarios, end to end through the Coordinator (actors, memory store, TestClock), with
 * their own numbers: concurrent requests are all in flight at once, and the protocol says what stands.
 */
import { afterEach, describe, expect, it } from "vitest"
import type { Command } from "../../src/domain/commands.js"
import { defaultConfig } from "../../src/domain/config.js"
import type { Result } from "../../src/domain/results.js"
import { makeMemoryStore } from "../../src/store/MemoryStore.js"
import type { CoordinatorHarness } from "../support/harness.js"
import { startCoordinator } from "../support/harness.js"
import { hold, holdResult, meter } from "./support.js"

/** An hour before a month boundary. */
const T0 = Date.UTC(2026, 2, 31, 23)
const MB = 1_000_000

let harness: CoordinatorHarness | undefined
afterEach(async () => {
  await harness?.close()
  harness = undefined
})

const start = async (): Promise<CoordinatorHarness> => {
  const store = makeMemoryStore()
  harness = await startCoordinator({ config: defaultConfig, store, startAt: T0 })
  return harness
}

/** Fires every command before awaiting any: they are all in flight at once. */
const concurrently = (
  coordinator: CoordinatorHarness,
  commands: ReadonlyArray<Command>
): Promise<Array<Result>> => Promise.all(commands.map((command) => coordinator.fire(command).promise))

const statuses = (results: ReadonlyArray<Result>): Array<string> =>
  results.map((result) => result.status).sort()

describe("seed scenarios through the Coordinator", () => {
  it("4 985 of 5 000 analyses used, two concurrent requests of 10: exactly one is reserved", async () => {
    const coordinator = await start()
    await coordinator.send({
      op: "adjust",
      user: "acme",
      meter: "analysis",
      amount: 4_985,
      id: "usage-so-far"
    })
    const results = await concurrently(coordinator, [
      { op: "reserve", user: "acme", meter: "analysis", amount: 10, id: "job-a", ttlMs: 3_600_000 },
      { op: "reserve", user: "acme", meter: "analysis", amount: 10, id: "job-b", ttlMs: 3_600_000 }
    ])
    expect(statuses(results)).toEqual(["insufficient_quota", "reserved"])
    const granted = results.find((result) => result.status === "reserved")!
    const refused = results.find((result) => result.status === "insufficient_quota")!
    expect(granted).toMatchObject(meter("analysis", 5_000, 4_985, 10))
    expect(refused).toEqual({
      status: "insufficient_quota",
      requested: 10,
      pendingHolds: 1,
      ...meter("analysis", 5_000, 4_985, 10)
    })
  })

  it("a 400 000-token budget, three concurrent 350 000-token analyses: one runs; it consumes, then commits below the estimate", async () => {
    const coordinator = await start()
    const analyses = ["a1", "a2", "a3"].map((id): Command => ({
      op: "reserve",
      user: "acme",
      meter: "tokens",
      amount: 350_000,
      id,
      ttlMs: 3_600_000
    }))
    const results = await concurrently(coordinator, analyses)
    expect(statuses(results)).toEqual(["insufficient_quota", "insufficient_quota", "reserved"])
    for (const refused of results.filter((result) => result.status === "insufficient_quota")) {
      expect(refused).toEqual({
        status: "insufficient_quota",
        requested: 350_000,
        pendingHolds: 1,
        ...meter("tokens", 400_000, 0, 350_000)
      })
    }
    const id = (results.find((result) => result.status === "reserved") as { id: string }).id
    const expiresAt = T0 + 3_600_000

    // Incremental consumption as the model streams tokens.
    expect(
      await coordinator.send({ op: "consume", user: "acme", id, amount: 100_000, key: "chunk-1" })
    ).toEqual(
      holdResult(
        "consumed",
        meter("tokens", 400_000, 100_000, 250_000),
        hold(id, 350_000, 100_000, "pending", expiresAt)
      )
    )
    expect(
      await coordinator.send({ op: "consume", user: "acme", id, amount: 120_000, key: "chunk-2" })
    ).toEqual(
      holdResult(
        "consumed",
        meter("tokens", 400_000, 220_000, 130_000),
        hold(id, 350_000, 220_000, "pending", expiresAt)
      )
    )
    // A retried chunk is not charged twice.
    expect(
      await coordinator.send({ op: "consume", user: "acme", id, amount: 120_000, key: "chunk-2" })
    ).toMatchObject({ status: "exists", used: 220_000, consumed: 220_000 })
    // The work used 280 000 in all: the hold's rest (70 000 of the estimate) is returned.
    expect(await coordinator.send({ op: "commit", user: "acme", id, amount: 280_000 })).toEqual(
      holdResult(
        "committed",
        meter("tokens", 400_000, 280_000, 0),
        hold(id, 350_000, 280_000, "committed", expiresAt)
      )
    )
    // The refused analyses may retry now that the budget is known: 120 000 left.
    expect(
      await coordinator.send({
        op: "reserve",
        user: "acme",
        meter: "tokens",
        amount: 350_000,
        id: "a4",
        ttlMs: 3_600_000
      })
    ).toMatchObject({ status: "insufficient_quota", pendingHolds: 0, available: 120_000 })
  })

  it("800 of 1 000 MB stored, uploads of 100 and 150 MB at once: 250 does not fit in 200, so one is granted", async () => {
    const coordinator = await start()
    await coordinator.send({
      op: "adjust",
      user: "acme",
      meter: "storage_bytes",
      amount: 800 * MB,
      id: "stored"
    })
    const results = await concurrently(coordinator, [
      { op: "reserve", user: "acme", meter: "storage_bytes", amount: 100 * MB, id: "up-100", ttlMs: 600_000 },
      { op: "reserve", user: "acme", meter: "storage_bytes", amount: 150 * MB, id: "up-150", ttlMs: 600_000 }
    ])
    expect(statuses(results)).toEqual(["insufficient_quota", "reserved"])
    const granted = results.find((result) => result.status === "reserved") as { id: string; amount: number }
    const refused = results.find((result) => result.status === "insufficient_quota")!
    expect(refused).toEqual({
      status: "insufficient_quota",
      requested: granted.amount === 100 * MB ? 150 * MB : 100 * MB,
      pendingHolds: 1,
      ...meter("storage_bytes", 1_000 * MB, 800 * MB, granted.amount)
    })

    // The granted upload fails: its hold is released, nothing is charged.
    expect(await coordinator.send({ op: "release", user: "acme", id: granted.id })).toMatchObject({
      status: "released",
      ...meter("storage_bytes", 1_000 * MB, 800 * MB, 0)
    })
    // The 150 MB upload, retried alone, fits: 800 + 150 <= 1 000.
    expect(
      await coordinator.send({
        op: "reserve",
        user: "acme",
        meter: "storage_bytes",
        amount: 150 * MB,
        id: "up-150-retry",
        ttlMs: 600_000
      })
    ).toMatchObject({ status: "reserved", ...meter("storage_bytes", 1_000 * MB, 800 * MB, 150 * MB) })
    expect(
      await coordinator.send({ op: "commit", user: "acme", id: "up-150-retry", amount: undefined })
    ).toMatchObject({
      status: "committed",
      ...meter("storage_bytes", 1_000 * MB, 950 * MB, 0)
    })
    // A deleted 200 MB file is refunded with adjust; a retry of the refund changes nothing.
    const refund: Command = {
      op: "adjust",
      user: "acme",
      meter: "storage_bytes",
      amount: -200 * MB,
      id: "delete-f1"
    }
    expect(await coordinator.send(refund)).toEqual({
      status: "adjusted",
      id: "delete-f1",
      ...meter("storage_bytes", 1_000 * MB, 750 * MB, 0)
    })
    expect(await coordinator.send(refund)).toEqual({
      status: "exists",
      id: "delete-f1",
      ...meter("storage_bytes", 1_000 * MB, 750 * MB, 0)
    })
    // storage_bytes is a gauge (period none): no periodStart, and it does not reset at the month's end.
    await coordinator.advance(Date.UTC(2026, 3, 1) - T0)
    const usage = await coordinator.send({ op: "get_usage", user: "acme" })
    expect(usage.status === "ok" && "meters" in usage ? usage.meters[3] : usage).toEqual({
      period: "none",
      periodStart: null,
      pendingHolds: 0,
      ...meter("storage_bytes", 1_000 * MB, 750 * MB, 0)
    })
  })

  it("a Free user's 10 concurrent acquire_slot: 1 acquired, 9 busy with retryAfterMs in [30 s, 40 s)", async () => {
    const coordinator = await start()
    const results = await concurrently(
      coordinator,
      Array.from({ length: 10 }, (_, index): Command => ({
        op: "acquire_slot",
        user: "free-user",
        job: `job-${index}`,
        leaseMs: 120_000,
        waitMs: 0
      }))
    )
    expect(results.filter((result) => result.status === "acquired")).toHaveLength(1)
    const busy = results.filter((result) => result.status === "busy")
    expect(busy).toHaveLength(9)
    for (const result of busy) {
      expect(result).toMatchObject({ limit: 1, held: 1 })
      const retryAfterMs = (result as { retryAfterMs: number }).retryAfterMs
      expect(retryAfterMs).toBeGreaterThanOrEqual(30_000)
      expect(retryAfterMs).toBeLessThan(40_000)
    }
  })

  it("a Free user's waiting acquire_slot is answered when the slot is released, in FIFO order", async () => {
    const coordinator = await start()
    const acquire = (job: string, waitMs: number): Command => ({
      op: "acquire_slot",
      user: "free-user",
      job,
      leaseMs: 120_000,
      waitMs
    })
    expect(await coordinator.send(acquire("first", 0))).toMatchObject({ status: "acquired" })
    const second = coordinator.fire(acquire("second", 60_000))
    const third = coordinator.fire(acquire("third", 60_000))
    await coordinator.advance(1_000)
    expect([second.settled(), third.settled()]).toEqual([false, false])
    expect(await coordinator.send({ op: "release_slot", user: "free-user", job: "first" })).toMatchObject({
      status: "released"
    })
    expect(await second.promise).toMatchObject({ status: "acquired", held: 1, leaseExpiresAt: T0 + 121_000 })
    expect(third.settled()).toBe(false)
    // The third's wait runs out 60 s after it asked: busy.
    await coordinator.advance(59_000)
    expect(await third.promise).toMatchObject({ status: "busy", limit: 1, held: 1 })
  })
})
