/**
 * `withHold` and `withSlot` against the fake coordinator's model: what they send, in what order, and
 * what they throw.
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest"
import {
  HoldNotCommitted,
  HoldNotGranted,
  QuotaClient,
  SlotBusy,
  SlotLeaseLost,
  SlotNotGranted
} from "../../src/client/index.js"
import type { Answer, Command } from "./fakeCoordinator.js"
import { FakeCoordinator, modelLimit, natsUrl, randomPrefix } from "./fakeCoordinator.js"

const prefix = randomPrefix("helpers")
const partitions = 8
let answer: (command: Command) => Answer | undefined = () => undefined

let fake: FakeCoordinator
let client: QuotaClient
beforeAll(async () => {
  fake = await FakeCoordinator.start({ prefix, partitions, answer: (command) => answer(command) })
  client = await QuotaClient.connect({ servers: natsUrl, prefix, partitions })
})
afterEach(() => {
  answer = () => undefined
})
afterAll(async () => {
  await client.close()
  await fake.stop()
})

let userCounter = 0
const freshUser = () => `helper-user-${(userCounter += 1)}`
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))
const opsOf = (user: string) =>
  fake
    .commandsReceived()
    .filter((command) => command.user === user)
    .map((command) => command.op)

describe("withHold", () => {
  it("reserves, runs the work, and commits the actual amount it reports", async () => {
    const user = freshUser()
    const outcome = await client.withHold(
      { user, meter: "tokens", amount: 100, id: "job-1" },
      async (hold) => {
        expect(hold).toMatchObject({ status: "reserved", id: "job-1" })
        return { actual: 37, summary: "done" }
      }
    )
    expect(outcome.value.summary).toBe("done")
    expect(outcome.commit).toMatchObject({ status: "committed", consumed: 37 })
    expect(fake.holds.get(`${user}/job-1`)).toMatchObject({ state: "committed", committedAmount: 37 })
    expect(fake.used.get(`${user}/tokens`)).toBe(37)
    expect(opsOf(user)).toEqual(["reserve", "commit"])
  })

  it("accepts a plain number as the actual amount", async () => {
    const user = freshUser()
    await client.withHold({ user, meter: "tokens", amount: 10, id: "job-2" }, async () => 4)
    expect(fake.holds.get(`${user}/job-2`)?.committedAmount).toBe(4)
  })

  it("releases the hold and rethrows the work's own error when the work fails", async () => {
    const user = freshUser()
    const failure = new Error("work failed")
    const thrown = await client
      .withHold({ user, meter: "tokens", amount: 10, id: "job-3" }, async () => {
        throw failure
      })
      .catch((e: unknown) => e)
    expect(thrown).toBe(failure)
    expect(fake.holds.get(`${user}/job-3`)?.state).toBe("released")
    expect(opsOf(user)).toEqual(["reserve", "release"])
  })

  it("throws HoldNotGranted with the result, without running the work, when the quota is short", async () => {
    const user = freshUser()
    let ran = false
    const thrown = await client
      .withHold({ user, meter: "tokens", amount: modelLimit + 1, id: "job-4" }, async () => {
        ran = true
        return 0
      })
      .catch((e: unknown) => e)
    expect(thrown).toBeInstanceOf(HoldNotGranted)
    expect((thrown as HoldNotGranted).result).toMatchObject({
      status: "insufficient_quota",
      requested: modelLimit + 1
    })
    expect(ran).toBe(false)
    expect(opsOf(user)).toEqual(["reserve"])
  })

  it("runs the work on an existing pending hold of the same id (a retried withHold)", async () => {
    const user = freshUser()
    await client.reserve({ user, meter: "tokens", amount: 10, id: "job-5" })
    const outcome = await client.withHold(
      { user, meter: "tokens", amount: 10, id: "job-5" },
      async (hold) => {
        expect(hold.status).toBe("exists")
        return 3
      }
    )
    expect(outcome.commit.status).toBe("committed")
  })

  it("throws HoldNotCommitted when the hold was closed while the work ran", async () => {
    const user = freshUser()
    const thrown = await client
      .withHold({ user, meter: "tokens", amount: 10, id: "job-6" }, async () => {
        await client.release({ user, id: "job-6" })
        return 5
      })
      .catch((e: unknown) => e)
    expect(thrown).toBeInstanceOf(HoldNotCommitted)
    expect(thrown).toMatchObject({ actual: 5, result: { status: "closed" } })
  })
})

describe("withSlot", () => {
  it("renews the lease every leaseMs/3 while the work runs, then releases the slot", async () => {
    const user = freshUser()
    const value = await client.withSlot({ user, job: "render", leaseMs: 1_000 }, async (slot, signal) => {
      expect(slot.status).toBe("acquired")
      await sleep(1_100)
      expect(signal.aborted).toBe(false)
      return "rendered"
    })
    expect(value).toBe("rendered")
    const ops = opsOf(user)
    // Renewals at about 333, 666 and 999 ms; timers may slip by one.
    const renewals = ops.filter((op) => op === "renew_slot").length
    expect(renewals).toBeGreaterThanOrEqual(2)
    expect(renewals).toBeLessThanOrEqual(4)
    expect(ops[0]).toBe("acquire_slot")
    expect(ops.at(-1)).toBe("release_slot")
    expect(fake.slots.get(user)?.size).toBe(0)
    const renewCommand = fake
      .commandsReceived()
      .find((command) => command.user === user && command.op === "renew_slot")
    expect(renewCommand).toEqual({ op: "renew_slot", user, job: "render", leaseMs: 1_000 })
  })

  it("honours renewEveryMs", async () => {
    const user = freshUser()
    await client.withSlot({ user, job: "quick", renewEveryMs: 40 }, () => sleep(300))
    expect(opsOf(user).filter((op) => op === "renew_slot").length).toBeGreaterThanOrEqual(4)
  })

  it("releases the slot and rethrows when the work fails", async () => {
    const user = freshUser()
    const failure = new Error("render failed")
    const thrown = await client
      .withSlot({ user, job: "failing" }, async () => {
        throw failure
      })
      .catch((e: unknown) => e)
    expect(thrown).toBe(failure)
    expect(opsOf(user)).toEqual(["acquire_slot", "release_slot"])
    expect(fake.slots.get(user)?.size).toBe(0)
  })

  it("throws SlotBusy with retryAfterMs when every slot is taken, without running the work", async () => {
    const user = freshUser()
    await client.acquireSlot({ user, job: "holder" })
    let ran = false
    const thrown = await client
      .withSlot({ user, job: "second" }, async () => {
        ran = true
      })
      .catch((e: unknown) => e)
    expect(thrown).toBeInstanceOf(SlotBusy)
    expect(thrown).toMatchObject({ retryAfterMs: 30_000, result: { status: "busy" } })
    expect(ran).toBe(false)
  })

  it("throws SlotNotGranted on another refusal", async () => {
    answer = (command) =>
      command.op === "acquire_slot"
        ? { status: "invalid_request", error: "leaseMs: out of range" }
        : undefined
    const thrown = await client
      .withSlot({ user: freshUser(), job: "j", leaseMs: 5 }, async () => 1)
      .catch((e) => e)
    expect(thrown).toBeInstanceOf(SlotNotGranted)
  })

  it("aborts the work's signal with SlotLeaseLost when a renewal finds the lease gone", async () => {
    answer = (command) =>
      command.op === "renew_slot" ? { status: "not_found", limit: 1, held: 0 } : undefined
    const user = freshUser()
    const reason = await client.withSlot({ user, job: "lost", renewEveryMs: 30 }, (_slot, signal) =>
      Promise.race([
        new Promise((resolve) => signal.addEventListener("abort", () => resolve(signal.reason))),
        sleep(2_000).then(() => "never aborted")
      ])
    )
    expect(reason).toBeInstanceOf(SlotLeaseLost)
    // Renewing stops once the lease is known lost.
    expect(opsOf(user)).toEqual(["acquire_slot", "renew_slot", "release_slot"])
  })
})
