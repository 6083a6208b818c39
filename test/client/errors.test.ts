/**
 * Errors a worker can act on (issue 30 items 2 and 3): `limit_reached` from the helpers is its own
 * type with `bound` and `max`, and every error's message names the user, the hold id or job, and the
 * figures the reply carried.
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest"
import {
  HoldNotCommitted,
  HoldNotGranted,
  LimitReached,
  QuotaClient,
  QuotaRetriesExhausted,
  SlotBusy,
  SlotNotGranted
} from "../../src/client/index.js"
import type { Answer, Command } from "./fakeCoordinator.js"
import { FakeCoordinator, modelLimit, natsUrl, randomPrefix } from "./fakeCoordinator.js"

const prefix = randomPrefix("errors")
const partitions = 8
let answer: (command: Command) => Answer | undefined = () => undefined

let fake: FakeCoordinator
let client: QuotaClient
beforeAll(async () => {
  fake = await FakeCoordinator.start({ prefix, partitions, answer: (command) => answer(command) })
  client = await QuotaClient.connect({
    servers: natsUrl,
    prefix,
    partitions,
    retry: { attemptsMax: 2, baseDelayMs: 5, delayMsMax: 5 }
  })
})
afterEach(() => {
  answer = () => undefined
})
afterAll(async () => {
  await client.close()
  await fake.stop()
})

const failureOf = (call: Promise<unknown>): Promise<Error> =>
  call.then(
    () => {
      throw new Error("expected a failure")
    },
    (error: unknown) => error as Error
  )
const limitReachedOn = (op: string, bound: string, max: number) => (command: Command) =>
  command.op === op ? { status: "limit_reached", bound, max } : undefined

describe("limit_reached from the helpers", () => {
  it("withHold throws LimitReached with bound and max, naming the user and the hold", async () => {
    answer = limitReachedOn("reserve", "pending_holds", 10_000)
    const error = await failureOf(
      client.withHold({ user: "ann", meter: "tokens", amount: 5, id: "job-7" }, async () => 5)
    )
    expect(error).toBeInstanceOf(LimitReached)
    expect(error).toMatchObject({ bound: "pending_holds", max: 10_000, user: "ann", id: "job-7" })
    expect(error.message).toBe(
      'quota: reserve (user "ann", hold "job-7") refused: limit_reached, bound pending_holds, max 10000'
    )
  })

  it("withSlot throws LimitReached with bound and max, naming the user and the job", async () => {
    answer = limitReachedOn("acquire_slot", "slot_waiters", 1_000)
    const error = await failureOf(client.withSlot({ user: "bob", job: "river-9", waitMs: 10 }, async () => 1))
    expect(error).toBeInstanceOf(LimitReached)
    expect(error).toMatchObject({ bound: "slot_waiters", max: 1_000, user: "bob", job: "river-9" })
    expect(error.message).toBe(
      'quota: acquire_slot (user "bob", job "river-9") refused: limit_reached, bound slot_waiters, max 1000'
    )
  })
})

describe("messages name the user, the id or job, and the reply's figures", () => {
  it("HoldNotGranted", async () => {
    const error = await failureOf(
      client.withHold({ user: "cy", meter: "tokens", amount: modelLimit + 1, id: "big" }, async () => 0)
    )
    expect(error).toBeInstanceOf(HoldNotGranted)
    expect(error.message).toMatch(/^quota: hold "big" of user "cy" not granted: insufficient_quota \(/)
    expect(error.message).toContain(`requested ${modelLimit + 1}`)
    expect(error.message).toContain(`limit ${modelLimit}`)
  })

  it("HoldNotCommitted", async () => {
    answer = (command) =>
      command.op === "commit" ? { status: "closed", id: "gone", state: "expired" } : undefined
    const error = await failureOf(
      client.withHold({ user: "di", meter: "tokens", amount: 3, id: "gone" }, async () => 2)
    )
    expect(error).toBeInstanceOf(HoldNotCommitted)
    expect(error.message).toBe(
      'quota: hold "gone" of user "di" not committed (actual 2): closed (id "gone", state "expired")'
    )
  })

  it("SlotBusy and SlotNotGranted", async () => {
    answer = (command) =>
      command.op === "acquire_slot" ? { status: "busy", limit: 2, held: 2, retryAfterMs: 1_500 } : undefined
    const busy = await failureOf(client.withSlot({ user: "ed", job: "j1" }, async () => 1))
    expect(busy).toBeInstanceOf(SlotBusy)
    expect(busy.message).toBe(
      'quota: slot for job "j1" of user "ed" busy (limit 2, held 2): retry after 1500 ms'
    )
    answer = (command) =>
      command.op === "acquire_slot"
        ? { status: "invalid_request", error: "leaseMs: out of range" }
        : undefined
    const refused = await failureOf(client.withSlot({ user: "ed", job: "j2" }, async () => 1))
    expect(refused).toBeInstanceOf(SlotNotGranted)
    expect(refused.message).toBe(
      'quota: slot for job "j2" of user "ed" not granted: invalid_request (error "leaseMs: out of range")'
    )
  })

  it("QuotaRetriesExhausted", async () => {
    answer = () => ({ status: "unavailable" })
    const error = await failureOf(client.consume({ user: "fay", id: "h1", amount: 1, key: "k1" }))
    expect(error).toBeInstanceOf(QuotaRetriesExhausted)
    expect(error.message).toMatch(
      /^quota: consume \(user "fay", hold "h1", key "k1"\) on \S+\.ops: unavailable after 2 attempts in \d+ ms$/
    )
  })
})
