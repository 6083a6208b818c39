/**
 * The client against the real coordinator (memory store) behind the real NATS transport: coalesced
 * batches keep the limit exact, the helpers leave the user's usage and slots as they should, and a
 * partition that stops being served is retried until it is served again.
 */
import { Effect } from "effect"
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest"
import { QuotaClient, SlotBusy } from "../../src/client/index.js"
import { partitionOf } from "../../src/domain/partition.js"
import type { Harness } from "../transport/support.js"
import { startHarness } from "../transport/support.js"

let harness: Harness
let client: QuotaClient
beforeAll(async () => {
  harness = await startHarness({ label: "client" })
  // Constructed on the harness's connection: the client must leave it open on close.
  client = new QuotaClient(harness.client, {
    prefix: harness.prefix,
    partitions: harness.partitions,
    retry: { attemptsMax: 100, baseDelayMs: 10, delayMsMax: 50 }
  })
})
afterAll(async () => {
  await client.close()
  expect(harness.client.isClosed()).toBe(false)
  await harness.close()
})

let userCounter = 0
const freshUser = () => `client-user-${(userCounter += 1)}`
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))
const analysisOf = async (user: string) => {
  const usage = await client.getUsage({ user })
  if (usage.status !== "ok") throw new Error(`get_usage answered ${usage.status}`)
  return { usage, analysis: usage.meters.find((meter) => meter.meter === "analysis")! }
}

describe("QuotaClient against the coordinator", () => {
  it("coalesces 500 concurrent reserves of one user and the limit still holds exactly", async () => {
    const user = freshUser()
    const before = client.counters()
    const results = await Promise.all(
      Array.from({ length: 500 }, (_, index) =>
        client.reserve({ user, meter: "analysis", amount: 20, id: `job-${index}`, ref: `job-${index}` })
      )
    )
    results.forEach((result, index) => expect(result.ref).toBe(`job-${index}`))
    const statuses = results.map((result) => result.status)
    // The free plan's analysis limit is 5 000: exactly 250 holds of 20 fit.
    expect(statuses.filter((status) => status === "reserved")).toHaveLength(250)
    expect(statuses.filter((status) => status === "insufficient_quota")).toHaveLength(250)
    const refused = results.find((result) => result.status === "insufficient_quota")
    expect(refused).toMatchObject({ requested: 20, pendingHolds: 250, available: 0 })
    expect(client.counters().messagesSent - before.messagesSent).toBeLessThanOrEqual(5)
    expect((await analysisOf(user)).analysis).toMatchObject({ reserved: 5_000, used: 0, pendingHolds: 250 })
  })

  it("matches results of many users in shared batches to their callers", async () => {
    const users = Array.from({ length: 200 }, () => freshUser())
    const before = client.counters()
    const results = await Promise.all(
      users.map((user, index) => client.reserve({ user, meter: "tokens", amount: index + 1, id: "t" }))
    )
    results.forEach((result, index) =>
      expect(result).toMatchObject({ status: "reserved", amount: index + 1 })
    )
    const partitionsUsed = new Set(users.map((user) => partitionOf(user, harness.partitions))).size
    expect(partitionsUsed).toBe(harness.partitions)
    // One message per partition: the 200 commands were issued in one tick.
    expect(client.counters().messagesSent - before.messagesSent).toBe(partitionsUsed)
  })

  it("withHold commits the work's actual amount", async () => {
    const user = freshUser()
    const outcome = await client.withHold(
      { user, meter: "analysis", amount: 10, id: "analysis-1" },
      async () => ({
        actual: 7
      })
    )
    expect(outcome.commit).toMatchObject({ status: "committed", consumed: 7, state: "committed" })
    expect((await analysisOf(user)).analysis).toMatchObject({ used: 7, reserved: 0, pendingHolds: 0 })
  })

  it("withHold releases the hold when the work fails", async () => {
    const user = freshUser()
    await expect(
      client.withHold({ user, meter: "analysis", amount: 10, id: "analysis-2" }, async () => {
        throw new Error("analysis crashed")
      })
    ).rejects.toThrow("analysis crashed")
    expect((await analysisOf(user)).analysis).toMatchObject({ used: 0, reserved: 0, pendingHolds: 0 })
  })

  it("withSlot holds the free plan's one slot; a second job is busy, then gets it by waiting", async () => {
    const user = freshUser()
    const first = client.withSlot({ user, job: "first", leaseMs: 1_000 }, async () => {
      await sleep(400)
      return "first done"
    })
    await vi.waitFor(async () => expect((await analysisOf(user)).usage.slots.held).toBe(1))
    const busy = await client.withSlot({ user, job: "second" }, async () => "never").catch((e: unknown) => e)
    expect(busy).toBeInstanceOf(SlotBusy)
    expect((busy as SlotBusy).retryAfterMs).toBeGreaterThan(0)
    const waited = await client.withSlot({ user, job: "third", waitMs: 5_000 }, async (slot) => slot.status)
    expect(waited).toBe("acquired")
    expect(await first).toBe("first done")
    expect((await analysisOf(user)).usage.slots).toMatchObject({ held: 0, waiting: 0 })
  })

  it("sends setPlan and setLimit to the admin subject", async () => {
    const user = freshUser()
    expect(await client.setPlan({ user, plan: "pro" })).toEqual({ status: "ok" })
    expect(await client.setLimit({ user, meter: "analysis", limit: 12 })).toEqual({ status: "ok" })
    expect(await client.setPlan({ user, plan: "no-such-plan" })).toMatchObject({ status: "unknown_plan" })
    const { usage, analysis } = await analysisOf(user)
    expect(usage.plan).toBe("pro")
    expect(analysis.limit).toBe(12)
  })

  it("answers through the Effect flavour", async () => {
    const user = freshUser()
    const result = await Effect.runPromise(
      client.effect.adjust({ user, meter: "storage_bytes", amount: 1_024, id: "upload-1" })
    )
    expect(result).toMatchObject({ status: "adjusted", used: 1_024 })
  })

  it("retries through a partition that is not served for a while", async () => {
    const user = freshUser()
    const partition = partitionOf(user, harness.partitions)
    await Effect.runPromise(harness.server.stopPartitions([partition]))
    const retriesBefore = client.counters().retries
    const pending = client.reserve({ user, meter: "analysis", amount: 1, id: "during-handover" })
    await vi.waitFor(() => expect(client.counters().retries).toBeGreaterThan(retriesBefore + 1))
    await Effect.runPromise(harness.server.servePartitions([partition]))
    expect(await pending).toMatchObject({ status: "reserved", id: "during-handover" })
    expect(await client.reserve({ user, meter: "analysis", amount: 1, id: "during-handover" })).toMatchObject(
      {
        status: "exists"
      }
    )
  })
})
