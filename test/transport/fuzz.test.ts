/**
 * Bad input through real NATS: each gets a clear error reply (a 400 service error, or a result naming the
 * field), and the server keeps answering. Generated: bodies that are not JSON, JSON that is not a command,
 * one field of a valid command replaced by a value that breaks its rule, unknown ops, wrong partitions.
 */
import fc from "fast-check"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { partitionOf } from "../../src/domain/partition.js"
import type { Harness } from "./support.js"
import { startHarness } from "./support.js"

let harness: Harness
beforeAll(async () => {
  harness = await startHarness({ label: "fuzz" })
})
afterAll(async () => {
  await harness.close()
})

const amountMax = Number.MAX_SAFE_INTEGER
const user = "fuzz-user"

/** The server still decides a valid command after whatever came before. */
const stillAnswers = async () => {
  expect(await harness.call(user, { op: "get_usage", user })).toMatchObject({ status: "ok" })
}

const notJson = fc.oneof(fc.string(), fc.string({ unit: "binary" })).filter((text) => {
  try {
    JSON.parse(text)
    return false
  } catch {
    return true
  }
})

const jsonScalar = fc.oneof(
  fc.integer(),
  fc.double({ noNaN: true, noDefaultInfinity: true }),
  fc.string(),
  fc.boolean(),
  fc.constant(null)
)

const notAnAmount = fc.oneof(
  fc.integer({ max: -1 }),
  fc.double({ noNaN: true, noDefaultInfinity: true }).filter((value) => !Number.isInteger(value)),
  fc.constantFrom(amountMax + 1, 2 ** 60, 1e300, -0.5, -amountMax - 1),
  fc.string(),
  fc.boolean(),
  fc.array(fc.integer(), { maxLength: 2 }),
  fc.constant({})
)

const notAnIdentifier = fc.oneof(
  fc.integer(),
  fc.boolean(),
  fc.constant({}),
  fc.constant(""),
  fc.string({ minLength: 257, maxLength: 400 }),
  fc
    .string({ unit: "grapheme", minLength: 65, maxLength: 80 })
    .filter((text) => Buffer.byteLength(text) > 256),
  fc.string({ maxLength: 10 }).map((text) => `${text}\ud800`)
)

const notAMeter = fc.oneof(
  fc.string().filter((text) => !/^[a-z][a-z0-9_]{0,62}$/.test(text)),
  fc.integer(),
  fc.constant([])
)

/** A valid command, the field to break, and what breaks it. */
const brokenCommand = fc.oneof(
  fc.record({
    base: fc.constant({ op: "reserve", user, meter: "tokens", amount: 1, id: "h" }),
    field: fc.constant("amount"),
    value: notAnAmount
  }),
  fc.record({
    base: fc.constant({ op: "reserve", user, meter: "tokens", amount: 1, id: "h" }),
    field: fc.constantFrom("id"),
    value: notAnIdentifier
  }),
  fc.record({
    base: fc.constant({ op: "reserve", user, meter: "tokens", amount: 1, id: "h" }),
    field: fc.constant("meter"),
    value: notAMeter
  }),
  fc.record({
    base: fc.constant({ op: "consume", user, id: "h", amount: 1, key: "k" }),
    field: fc.constantFrom("key", "id"),
    value: notAnIdentifier
  }),
  fc.record({
    base: fc.constant({ op: "reserve", user, meter: "tokens", amount: 1, id: "h" }),
    field: fc.constant("ttlMs"),
    value: fc.oneof(fc.integer({ max: 999 }), fc.integer({ min: 86_400_001 }), fc.string())
  }),
  fc.record({
    base: fc.constant({ op: "acquire_slot", user, job: "j" }),
    field: fc.constant("waitMs"),
    value: fc.oneof(
      fc.integer({ max: -1 }),
      fc.integer({ min: 300_001 }),
      fc.double({ min: 0.1, max: 0.9, noNaN: true })
    )
  }),
  fc.record({
    base: fc.constant({ op: "get_usage", user }),
    field: fc.constant("op"),
    value: fc
      .string()
      .filter(
        (op) =>
          ![
            "reserve",
            "consume",
            "commit",
            "release",
            "extend",
            "adjust",
            "acquire_slot",
            "renew_slot",
            "release_slot",
            "get_usage",
            "set_plan",
            "set_limit"
          ].includes(op)
      )
  })
)

describe("fuzzed bad input", () => {
  it("answers any body that is not JSON with a 400 service error", async () => {
    await fc.assert(
      fc.asyncProperty(notJson, async (body) => {
        const reply = await harness.request(harness.subject(user), body)
        expect(reply.bytes).toBe(0)
        expect(reply.headers?.get("Nats-Service-Error-Code")).toBe("400")
        expect(reply.headers?.get("Nats-Service-Error")).toMatch(/^body is not/)
      }),
      { numRuns: 100 }
    )
    await stillAnswers()
  })

  it("answers JSON that is neither object nor array with a 400 service error", async () => {
    await fc.assert(
      fc.asyncProperty(jsonScalar, async (value) => {
        const reply = await harness.request(harness.subject(user), JSON.stringify(value))
        expect(reply.headers?.get("Nats-Service-Error-Code")).toBe("400")
      }),
      { numRuns: 50 }
    )
    await stillAnswers()
  })

  it("names the broken field, alone and inside a batch with a valid command", async () => {
    await fc.assert(
      fc.asyncProperty(
        brokenCommand,
        fc.option(fc.string({ maxLength: 20 })),
        async ({ base, field, value }, ref) => {
          const command = { ...base, [field]: value, ...(ref === null ? {} : { ref }) }
          const single = (await harness.call(user, command)) as Record<string, unknown>
          expect(single["status"]).toBe("invalid_request")
          expect(single["error"]).toMatch(new RegExp(`^${field}: `))
          expect(single["ref"]).toBe(ref ?? undefined)
          const batch = (await harness.call(user, [command, { op: "get_usage", user }])) as Array<
            Record<string, unknown>
          >
          expect(batch.map((result) => result["status"])).toEqual(["invalid_request", "ok"])
        }
      ),
      { numRuns: 300 }
    )
    await stillAnswers()
  })

  it("answers a valid command for another partition's user wrong_partition", async () => {
    await fc.assert(
      fc.asyncProperty(fc.string({ minLength: 1, maxLength: 40 }), async (stranger) => {
        fc.pre(partitionOf(stranger, harness.partitions) !== partitionOf(user, harness.partitions))
        fc.pre(!/\p{Cs}/u.test(stranger))
        const reply = await harness.request(
          harness.subject(user),
          JSON.stringify({ op: "get_usage", user: stranger, ref: "x" })
        )
        expect(reply.body).toEqual({ status: "wrong_partition", ref: "x" })
      }),
      { numRuns: 100 }
    )
    await stillAnswers()
  })

  it("never leaves a request unanswered, whatever the object holds", async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.oneof(
          fc.jsonValue(),
          fc.array(fc.object(), { maxLength: 20 }),
          fc.dictionary(fc.string(), fc.jsonValue())
        ),
        async (value) => {
          const reply = await harness.request(harness.subject(user), JSON.stringify(value) ?? "null")
          const refused = reply.headers?.get("Nats-Service-Error-Code") === "400"
          const results = Array.isArray(reply.body) ? reply.body : [reply.body]
          expect(
            refused || results.every((result) => typeof (result as { status?: unknown }).status === "string")
          ).toBe(true)
        }
      ),
      { numRuns: 200 }
    )
    await stillAnswers()
  })
})
