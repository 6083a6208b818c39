/**
 * Every operation and status through real NATS request/reply, against the real coordinator (memory
 * store): single commands, batches, ref echo, partition routing and the 400 service errors.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { messageNestingDepthMax } from "../../src/domain/limits.js"
import { partitionOf } from "../../src/domain/partition.js"
import type { Harness } from "./support.js"
import { startHarness } from "./support.js"

let harness: Harness
beforeAll(async () => {
  harness = await startHarness({ label: "wire", server: { messageBytesMax: 200_000 } })
})
afterAll(async () => {
  await harness.close()
})

type Reply = Record<string, unknown>
let userCounter = 0
/** A user no other test touches. */
const freshUser = (): string => `user-${(userCounter += 1)}`
const ops = async (user: string, command: Record<string, unknown>): Promise<Reply> =>
  (await harness.call(user, { user, ...command })) as Reply
const admin = async (user: string, command: Record<string, unknown>): Promise<Reply> =>
  (await harness.call(user, { user, ...command }, "admin")) as Reply

describe("limit_reached (revision 1.2)", () => {
  // A coordinator of its own without the per-decision recount (O(holds) each: quadratic here).
  let bounded: Harness
  beforeAll(async () => {
    bounded = await startHarness({ label: "wire-bounds", coordinator: { assertFull: false } })
  })
  afterAll(async () => {
    await bounded.close()
  })
  const boundedOps = async (user: string, command: Record<string, unknown>): Promise<Reply> =>
    (await bounded.call(user, { user, ...command })) as Reply

  it("a reserve past 10 000 pending holds: bound pending_holds and max, with ref; nothing changed", async () => {
    const user = freshUser()
    for (let batch = 0; batch < 10; batch += 1) {
      const commands = Array.from({ length: 1_000 }, (_, index) => ({
        op: "reserve",
        user,
        meter: "analysis",
        amount: 0,
        id: `h${batch * 1_000 + index}`
      }))
      const results = (await bounded.call(user, commands)) as Array<Reply>
      expect(new Set(results.map((result) => result["status"]))).toEqual(new Set(["reserved"]))
    }
    expect(
      await boundedOps(user, { op: "reserve", meter: "analysis", amount: 0, id: "past", ref: "r" })
    ).toEqual({ status: "limit_reached", bound: "pending_holds", max: 10_000, ref: "r" })
    expect(await boundedOps(user, { op: "reserve", meter: "analysis", amount: 0, id: "h1" })).toMatchObject({
      status: "exists"
    })
    const usage = await boundedOps(user, { op: "get_usage" })
    expect((usage["meters"] as Array<Reply>)[0]).toMatchObject({ meter: "analysis", pendingHolds: 10_000 })
  })
})

describe("reserve", () => {
  it("reserved, exists, conflict, then closed after release; with the meter's state", async () => {
    const user = freshUser()
    const reserved = await ops(user, {
      op: "reserve",
      meter: "analysis",
      amount: 10,
      id: "h1",
      ttlMs: 60_000
    })
    expect(reserved).toMatchObject({
      status: "reserved",
      meter: "analysis",
      limit: 5_000,
      used: 0,
      reserved: 10,
      available: 4_990,
      overage: 0,
      id: "h1",
      amount: 10,
      consumed: 0,
      state: "pending"
    })
    expect(typeof reserved["expiresAt"]).toBe("number")
    expect(await ops(user, { op: "reserve", meter: "analysis", amount: 10, id: "h1" })).toMatchObject({
      status: "exists",
      reserved: 10
    })
    expect(await ops(user, { op: "reserve", meter: "analysis", amount: 11, id: "h1" })).toMatchObject({
      status: "conflict",
      amount: 10
    })
    expect(await ops(user, { op: "release", id: "h1" })).toMatchObject({ status: "released", reserved: 0 })
    expect(await ops(user, { op: "reserve", meter: "analysis", amount: 10, id: "h1" })).toMatchObject({
      status: "closed",
      state: "released"
    })
  })

  it("insufficient_quota with requested and pendingHolds; unknown_meter", async () => {
    const user = freshUser()
    await ops(user, { op: "reserve", meter: "analysis", amount: 4_000, id: "big" })
    expect(await ops(user, { op: "reserve", meter: "analysis", amount: 1_001, id: "more" })).toMatchObject({
      status: "insufficient_quota",
      requested: 1_001,
      pendingHolds: 1,
      available: 1_000
    })
    expect(await ops(user, { op: "reserve", meter: "nosuch", amount: 1, id: "x" })).toEqual({
      status: "unknown_meter"
    })
  })
})

describe("consume, commit, release, extend", () => {
  it("consumed, exists for a repeated key, committed, exists again, closed for a new key", async () => {
    const user = freshUser()
    await ops(user, { op: "reserve", meter: "tokens", amount: 100, id: "job" })
    expect(await ops(user, { op: "consume", id: "job", amount: 30, key: "k1" })).toMatchObject({
      status: "consumed",
      used: 30,
      reserved: 70,
      consumed: 30
    })
    expect(await ops(user, { op: "consume", id: "job", amount: 30, key: "k1" })).toMatchObject({
      status: "exists",
      used: 30
    })
    expect(await ops(user, { op: "commit", id: "job", amount: 50 })).toMatchObject({
      status: "committed",
      used: 50,
      reserved: 0,
      consumed: 50,
      state: "committed"
    })
    expect(await ops(user, { op: "commit", id: "job", amount: 50 })).toMatchObject({
      status: "exists",
      used: 50
    })
    expect(await ops(user, { op: "consume", id: "job", amount: 1, key: "k2" })).toMatchObject({
      status: "closed"
    })
    expect(await ops(user, { op: "release", id: "job" })).toMatchObject({ status: "closed" })
    expect(await ops(user, { op: "extend", id: "job", ttlMs: 5_000 })).toMatchObject({ status: "closed" })
  })

  it("not_found for every hold command on an unknown id", async () => {
    const user = freshUser()
    for (const command of [
      { op: "consume", id: "none", amount: 1, key: "k" },
      { op: "commit", id: "none" },
      { op: "release", id: "none" },
      { op: "extend", id: "none", ttlMs: 5_000 }
    ]) {
      expect(await ops(user, command)).toEqual({ status: "not_found" })
    }
  })

  it("extended moves expiresAt; release twice is exists; commit after release is closed", async () => {
    const user = freshUser()
    const reserved = await ops(user, { op: "reserve", meter: "specview", amount: 1, id: "h", ttlMs: 1_000 })
    const extended = await ops(user, { op: "extend", id: "h", ttlMs: 600_000 })
    expect(extended["status"]).toBe("extended")
    expect(extended["expiresAt"] as number).toBeGreaterThan(reserved["expiresAt"] as number)
    expect(await ops(user, { op: "release", id: "h" })).toMatchObject({ status: "released" })
    expect(await ops(user, { op: "release", id: "h" })).toMatchObject({ status: "exists" })
    expect(await ops(user, { op: "commit", id: "h" })).toMatchObject({ status: "closed" })
  })
})

describe("adjust", () => {
  it("adjusted, exists, conflict, unknown_meter; a refund never goes below 0", async () => {
    const user = freshUser()
    expect(await ops(user, { op: "adjust", meter: "storage_bytes", amount: 500, id: "a1" })).toMatchObject({
      status: "adjusted",
      used: 500
    })
    expect(await ops(user, { op: "adjust", meter: "storage_bytes", amount: 500, id: "a1" })).toMatchObject({
      status: "exists",
      used: 500
    })
    expect(await ops(user, { op: "adjust", meter: "storage_bytes", amount: 501, id: "a1" })).toMatchObject({
      status: "conflict"
    })
    expect(await ops(user, { op: "adjust", meter: "storage_bytes", amount: -900, id: "a2" })).toMatchObject({
      status: "adjusted",
      used: 0
    })
    expect(await ops(user, { op: "adjust", meter: "nosuch", amount: 1, id: "a3" })).toEqual({
      status: "unknown_meter"
    })
  })
})

describe("slots", () => {
  it("acquired, exists, busy with retryAfterMs, renewed, released, not_found", async () => {
    const user = freshUser()
    const acquired = await ops(user, { op: "acquire_slot", job: "j1", leaseMs: 60_000 })
    expect(acquired).toMatchObject({ status: "acquired", limit: 1, held: 1 })
    expect(typeof acquired["leaseExpiresAt"]).toBe("number")
    expect(await ops(user, { op: "acquire_slot", job: "j1" })).toMatchObject({ status: "exists", held: 1 })
    const busy = await ops(user, { op: "acquire_slot", job: "j2" })
    expect(busy).toMatchObject({ status: "busy", limit: 1, held: 1 })
    expect(busy["retryAfterMs"] as number).toBeGreaterThanOrEqual(30_000)
    expect(busy["retryAfterMs"] as number).toBeLessThan(40_000)
    expect(await ops(user, { op: "renew_slot", job: "j1" })).toMatchObject({ status: "renewed" })
    expect(await ops(user, { op: "renew_slot", job: "j2" })).toMatchObject({ status: "not_found" })
    expect(await ops(user, { op: "release_slot", job: "j1" })).toMatchObject({ status: "released", held: 0 })
    expect(await ops(user, { op: "release_slot", job: "j1" })).toMatchObject({ status: "not_found" })
  })

  it("a waiting acquire_slot gets the slot when it is released", async () => {
    const user = freshUser()
    await ops(user, { op: "acquire_slot", job: "first" })
    const waiting = ops(user, { op: "acquire_slot", job: "second", waitMs: 10_000 })
    await new Promise((resolve) => setTimeout(resolve, 50))
    expect(await ops(user, { op: "release_slot", job: "first" })).toMatchObject({ status: "released" })
    expect(await waiting).toMatchObject({ status: "acquired", job: "second" })
  })

  it("a repeated acquire_slot of a waiting job: the earlier request is answered busy at once (revision 1.2)", async () => {
    const user = freshUser()
    await ops(user, { op: "acquire_slot", job: "first" })
    const earlier = ops(user, { op: "acquire_slot", job: "second", waitMs: 300_000, ref: "earlier" })
    await new Promise((resolve) => setTimeout(resolve, 50))
    const repeat = ops(user, { op: "acquire_slot", job: "second", waitMs: 300_000, ref: "repeat" })
    const answered = await earlier
    expect(answered).toMatchObject({ status: "busy", limit: 1, held: 1, ref: "earlier" })
    expect(typeof answered["retryAfterMs"]).toBe("number")
    expect(await ops(user, { op: "release_slot", job: "first" })).toMatchObject({ status: "released" })
    expect(await repeat).toMatchObject({ status: "acquired", job: "second", ref: "repeat" })
  })

  it("a system job (empty user) is acquired with limit null and held 0; renew and release are not_found", async () => {
    expect(harness.subject("")).toBe(`${harness.prefix}.v1.${partitionOf("", harness.partitions)}.ops`)
    expect(await ops("", { op: "acquire_slot", job: "sys" })).toMatchObject({
      status: "acquired",
      limit: null,
      held: 0
    })
    expect(await ops("", { op: "renew_slot", job: "sys" })).toMatchObject({
      status: "not_found",
      limit: null,
      held: 0
    })
    expect(await ops("", { op: "release_slot", job: "sys" })).toMatchObject({ status: "not_found" })
  })
})

describe("administration", () => {
  it("set_plan ok and unknown_plan; set_limit ok, null, unknown_meter; get_usage on both subjects", async () => {
    const user = freshUser()
    expect(await admin(user, { op: "set_plan", plan: "pro" })).toEqual({ status: "ok" })
    expect(await admin(user, { op: "set_plan", plan: "platinum" })).toEqual({ status: "unknown_plan" })
    expect(await admin(user, { op: "set_limit", meter: "tokens", limit: 7 })).toEqual({ status: "ok" })
    const usage = await admin(user, { op: "get_usage" })
    expect(usage).toMatchObject({
      status: "ok",
      plan: "pro",
      slots: { limit: 3, held: 0, jobs: [], waiting: 0 }
    })
    const meters = usage["meters"] as Array<Reply>
    expect(meters.map((meter) => meter["meter"])).toEqual(["analysis", "specview", "tokens", "storage_bytes"])
    expect(meters[2]).toMatchObject({ meter: "tokens", period: "month", limit: 7, pendingHolds: 0 })
    expect(meters[3]).toMatchObject({ period: "none", periodStart: null })
    expect(await admin(user, { op: "set_limit", meter: "tokens", limit: null })).toEqual({ status: "ok" })
    expect(((await ops(user, { op: "get_usage" }))["meters"] as Array<Reply>)[2]).toMatchObject({
      limit: 4_000_000
    })
    expect(await admin(user, { op: "set_limit", meter: "nosuch", limit: 1 })).toEqual({
      status: "unknown_meter"
    })
  })

  it("keeps operations and administration on their own subjects", async () => {
    const user = freshUser()
    expect(await ops(user, { op: "set_plan", plan: "pro" })).toEqual({
      status: "invalid_request",
      error: "op: set_plan is sent to .admin, not .ops"
    })
    expect(await admin(user, { op: "reserve", meter: "tokens", amount: 1, id: "x" })).toMatchObject({
      status: "invalid_request"
    })
  })
})

describe("errors, refs and batches", () => {
  it("invalid_request names the field; wrong_partition for another partition's user", async () => {
    const user = freshUser()
    expect(await ops(user, { op: "reserve", meter: "tokens", amount: -1, id: "x" })).toEqual({
      status: "invalid_request",
      error: "amount: must be an integer from 0 to 9007199254740991"
    })
    const other = Array.from({ length: 100 }, (_, index) => `other-${index}`).find(
      (candidate) => partitionOf(candidate, harness.partitions) !== partitionOf(user, harness.partitions)
    ) as string
    const reply = await harness.request(
      harness.subject(user),
      JSON.stringify({ op: "get_usage", user: other, ref: "wp" })
    )
    expect(reply.body).toEqual({ status: "wrong_partition", ref: "wp" })
  })

  it("echoes ref on every status, and never an invalid ref", async () => {
    const user = freshUser()
    expect(await ops(user, { op: "reserve", meter: "tokens", amount: 1, id: "r", ref: "a" })).toMatchObject({
      status: "reserved",
      ref: "a"
    })
    expect(await ops(user, { op: "release", id: "none", ref: "b" })).toEqual({
      status: "not_found",
      ref: "b"
    })
    expect(await ops(user, { op: "reserve", meter: "tokens", amount: 1.5, id: "r", ref: "c" })).toMatchObject(
      {
        status: "invalid_request",
        ref: "c"
      }
    )
    expect(await ops(user, { op: "get_usage", ref: 12 })).toEqual({
      status: "invalid_request",
      error: "ref: must be a string"
    })
    expect(await ops(user, { op: "get_usage", ref: "x".repeat(257) })).toEqual({
      status: "invalid_request",
      error: "ref: is 257 UTF-8 bytes, over 256"
    })
  })

  it("answers a batch in order; one user's commands decided in array order; a bad one gets its own result", async () => {
    const user = freshUser()
    const replies = (await harness.call(user, [
      { op: "reserve", user, meter: "tokens", amount: 10, id: "b", ref: "1" },
      { op: "consume", user, id: "b", amount: 4, key: "k" },
      { op: "bogus", user, ref: "3" },
      { op: "commit", user, id: "b", ref: "4" },
      { op: "get_usage", user }
    ])) as Array<Reply>
    expect(replies.map((reply) => reply["status"])).toEqual([
      "reserved",
      "consumed",
      "invalid_request",
      "committed",
      "ok"
    ])
    expect(replies.map((reply) => reply["ref"])).toEqual(["1", undefined, "3", "4", undefined])
    expect(replies[2]).toEqual({
      status: "invalid_request",
      error: 'op: unknown operation "bogus"',
      ref: "3"
    })
    expect(replies[3]).toMatchObject({ used: 10, consumed: 10 })
  })

  it("decides 1000 commands of one user in array order", async () => {
    const user = freshUser()
    const batch = Array.from({ length: 1_000 }, (_, index) => ({
      op: "adjust",
      user,
      meter: "tokens",
      amount: 1,
      id: `a${index}`
    }))
    const replies = (await harness.call(user, batch)) as Array<Reply>
    expect(replies.map((reply) => reply["used"])).toEqual(batch.map((_, index) => index + 1))
  })

  it("answers [] with []", async () => {
    expect(await harness.call(freshUser(), [])).toEqual([])
  })
})

describe("service errors (400, empty body)", () => {
  const expect400 = async (body: string | Uint8Array, reason: string) => {
    const reply = await harness.request(harness.subject("anyone"), body)
    expect(reply.bytes).toBe(0)
    expect(reply.headers?.get("Nats-Service-Error-Code")).toBe("400")
    expect(reply.headers?.get("Nats-Service-Error")).toContain(reason)
  }

  it.each([
    ["invalid JSON", "{op:", "body is not JSON"],
    ["an empty body", "", "body is not JSON"],
    ["a number", "42", "body must be a command object or an array of command objects"],
    ["a string", '"reserve"', "body must be a command object or an array of command objects"],
    ["null", "null", "body must be a command object or an array of command objects"],
    [
      "arrays nested past the limit",
      `${"[".repeat(messageNestingDepthMax + 1)}${"]".repeat(messageNestingDepthMax + 1)}`,
      `body nests arrays and objects deeper than ${messageNestingDepthMax} levels`
    ]
  ])("%s", async (_name, body, reason) => {
    await expect400(body, reason)
  })

  it("invalid UTF-8", async () => {
    await expect400(new Uint8Array([0x7b, 0xc3, 0x28, 0x7d]), "body is not UTF-8")
  })

  it("a body over the message limit", async () => {
    await expect400(
      JSON.stringify({ op: "get_usage", user: "x", pad: "p".repeat(200_000) }),
      "larger than 200000"
    )
  })

  it("a batch over 1000 commands", async () => {
    const batch = JSON.stringify(Array.from({ length: 1_001 }, () => ({ op: "get_usage", user: "anyone" })))
    await expect400(batch, "batch of 1001 commands is over the limit of 1000")
  })
})

describe("logs", () => {
  it("logs a grant with user, id and meter, and an acquired slot with user and job, at debug; administration at info", async () => {
    const user = freshUser()
    await ops(user, { op: "reserve", meter: "analysis", amount: 2, id: "logged" })
    await ops(user, { op: "acquire_slot", job: "logged-job" })
    await ops(user, { op: "commit", id: "logged" })
    await admin(user, { op: "set_plan", plan: "pro" })
    const lines = harness.logs.lines.filter((line) => line["user"] === user)
    // One line per decision is debug (20): at info a deployment logs no line per request.
    expect(lines).toContainEqual(
      expect.objectContaining({
        status: "reserved",
        user,
        id: "logged",
        meter: "analysis",
        amount: 2,
        level: 20
      })
    )
    expect(lines).toContainEqual(
      expect.objectContaining({ op: "set_plan", plan: "pro", status: "ok", level: 30 })
    )
    expect(lines).toContainEqual(expect.objectContaining({ status: "acquired", user, job: "logged-job" }))
    expect(lines).toContainEqual(
      expect.objectContaining({ status: "committed", user, id: "logged", meter: "analysis" })
    )
  })
})
