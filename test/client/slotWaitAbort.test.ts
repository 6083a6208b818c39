/**
 * A cancelled wait gives its slot back (issue 30 item 1): an `acquireSlot`/`withSlot` whose signal
 * aborts while it waits withdraws the wait at the real coordinator (PROTOCOL 1.2: a repeated
 * `acquire_slot` with `waitMs` 0 replaces the waiter), so the slot freed next goes to the next job.
 */
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest"
import { QuotaClient, SlotWaitAborted } from "../../src/client/index.js"
import type { Harness } from "../transport/support.js"
import { startHarness } from "../transport/support.js"

let harness: Harness
let client: QuotaClient
beforeAll(async () => {
  harness = await startHarness({ label: "slotabort" })
  client = new QuotaClient(harness.client, { prefix: harness.prefix, partitions: harness.partitions })
})
afterAll(async () => {
  await client.close()
  await harness.close()
})

let userCounter = 0
const freshUser = () => `abort-user-${(userCounter += 1)}`
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))
const slotsOf = async (user: string) => {
  const usage = await client.getUsage({ user })
  if (usage.status !== "ok") throw new Error(`get_usage answered ${usage.status}`)
  return usage.slots
}
/** What a call settled with within `ms`: its status, its error's tag, or "still waiting". */
const settledWithin = (call: Promise<unknown>, ms: number): Promise<unknown> =>
  Promise.race([
    call.then(
      (value) => (value as { status: string }).status,
      (error: unknown) => (error as { _tag?: string })._tag ?? String(error)
    ),
    sleep(ms).then(() => "still waiting")
  ])

describe("a cancelled slot wait", () => {
  it("acquireSlot: aborted while waiting, the next freed slot goes to the next job at once", async () => {
    const user = freshUser()
    expect(await client.acquireSlot({ user, job: "holder" })).toMatchObject({ status: "acquired" })
    const controller = new AbortController()
    const waiting = client.acquireSlot(
      { user, job: "cancelled", waitMs: 30_000 },
      { signal: controller.signal }
    )
    await vi.waitFor(async () => expect((await slotsOf(user)).waiting).toBe(1))
    controller.abort()
    const cancelled = await settledWithin(waiting, 1_000)
    const waitingAfterAbort = (await slotsOf(user)).waiting
    expect(await client.releaseSlot({ user, job: "holder" })).toMatchObject({ status: "released" })
    const next = await client.acquireSlot({ user, job: "next" })
    const slots = await slotsOf(user)
    expect({
      cancelled,
      waitingAfterAbort,
      next: next.status,
      jobs: slots.jobs.map((entry) => entry.job)
    }).toEqual({ cancelled: "SlotWaitAborted", waitingAfterAbort: 0, next: "acquired", jobs: ["next"] })
    await client.releaseSlot({ user, job: "next" })
  })

  it("withSlot: aborted while waiting, rejects with SlotWaitAborted naming the job; the work never runs", async () => {
    const user = freshUser()
    expect(await client.acquireSlot({ user, job: "holder" })).toMatchObject({ status: "acquired" })
    const controller = new AbortController()
    let ran = false
    const waiting = client.withSlot(
      { user, job: "river-42", waitMs: 30_000, signal: controller.signal },
      async () => {
        ran = true
      }
    )
    await vi.waitFor(async () => expect((await slotsOf(user)).waiting).toBe(1))
    controller.abort(new Error("job timeout"))
    const error = await Promise.race([waiting.catch((e: unknown) => e), sleep(1_000)])
    await client.releaseSlot({ user, job: "holder" })
    const next = await client.acquireSlot({ user, job: "next" })
    expect({ error: error instanceof SlotWaitAborted, next: next.status, ran }).toEqual({
      error: true,
      next: "acquired",
      ran: false
    })
    expect(String((error as Error).message)).toContain(user)
    expect(String((error as Error).message)).toContain("river-42")
    await client.releaseSlot({ user, job: "next" })
  })

  it("an already aborted signal sends nothing and rejects at once", async () => {
    const user = freshUser()
    const error = await client
      .acquireSlot({ user, job: "late", waitMs: 1_000 }, { signal: AbortSignal.abort() })
      .catch((e: unknown) => e)
    expect(error).toBeInstanceOf(SlotWaitAborted)
    expect((await slotsOf(user)).held).toBe(0)
  })
})
