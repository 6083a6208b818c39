/**
 * decode.ts against PROTOCOL.md, one row per field rule: the command each valid input becomes (with
 * defaults), and the `<field>: ...` error each invalid one gets.
 */
import fc from "fast-check"
import { describe, expect, it } from "vitest"
import { fnv1a32, partitionOf } from "../../src/domain/partition.js"
import type { SubjectKind } from "../../src/transport/decode.js"
import { decodeCommand, judgeCommand } from "../../src/transport/decode.js"
import { messageBytesMax, messageNestingDepthMax } from "../../src/domain/limits.js"
import { parseBody, scanBodyShape } from "../../src/transport/body.js"

const maxAmount = 9007199254740991
const bytes256 = "é".repeat(128)
const bytes257 = `${bytes256}a`

const reserve = { op: "reserve", user: "u", meter: "tokens", amount: 5, id: "h" }
const consume = { op: "consume", user: "u", id: "h", amount: 1, key: "k" }
const adjust = { op: "adjust", user: "u", meter: "tokens", amount: -3, id: "a" }
const acquire = { op: "acquire_slot", user: "u", job: "j" }
const setLimit = { op: "set_limit", user: "u", meter: "tokens", limit: 10 }

describe("decodeCommand: valid commands and their defaults", () => {
  const rows: Array<[string, SubjectKind, Record<string, unknown>, Record<string, unknown>]> = [
    ["reserve: ttlMs defaults to 3 600 000", "ops", reserve, { ...reserve, ttlMs: 3_600_000 }],
    ["null optional is absent", "ops", { ...reserve, ttlMs: null }, { ...reserve, ttlMs: 3_600_000 }],
    ["ttlMs at its bounds (min)", "ops", { ...reserve, ttlMs: 1_000 }, { ...reserve, ttlMs: 1_000 }],
    [
      "ttlMs at its bounds (max)",
      "ops",
      { ...reserve, ttlMs: 86_400_000 },
      { ...reserve, ttlMs: 86_400_000 }
    ],
    [
      "unknown fields are ignored",
      "ops",
      { ...reserve, job: 5, extra: [1] },
      { ...reserve, ttlMs: 3_600_000 }
    ],
    ["amount 0", "ops", { ...reserve, amount: 0 }, { ...reserve, amount: 0, ttlMs: 3_600_000 }],
    [
      "identifiers may hold U+0000 (PROTOCOL.md: any 1 to 256 UTF-8 bytes)",
      "ops",
      { ...reserve, user: "a\u0000b", id: "\u0000" },
      { ...reserve, user: "a\u0000b", id: "\u0000", ttlMs: 3_600_000 }
    ],
    [
      "amount 2^53-1",
      "ops",
      { ...reserve, amount: maxAmount },
      { ...reserve, amount: maxAmount, ttlMs: 3_600_000 }
    ],
    ["meter of 63 characters", "ops", { ...reserve, meter: `a${"b".repeat(62)}` }, {}],
    [
      "user of 256 UTF-8 bytes",
      "ops",
      { ...reserve, user: bytes256 },
      { ...reserve, user: bytes256, ttlMs: 3_600_000 }
    ],
    ["user with emoji and combining marks", "ops", { ...reserve, user: "👩‍💻e\u0301" }, {}],
    ["consume", "ops", consume, consume],
    [
      "commit without amount",
      "ops",
      { op: "commit", user: "u", id: "h" },
      { op: "commit", user: "u", id: "h", amount: undefined }
    ],
    [
      "commit amount null",
      "ops",
      { op: "commit", user: "u", id: "h", amount: null },
      { op: "commit", user: "u", id: "h", amount: undefined }
    ],
    [
      "commit with amount",
      "ops",
      { op: "commit", user: "u", id: "h", amount: 7 },
      { op: "commit", user: "u", id: "h", amount: 7 }
    ],
    ["release", "ops", { op: "release", user: "u", id: "h" }, { op: "release", user: "u", id: "h" }],
    [
      "extend",
      "ops",
      { op: "extend", user: "u", id: "h", ttlMs: 5_000 },
      { op: "extend", user: "u", id: "h", ttlMs: 5_000 }
    ],
    ["adjust negative", "ops", adjust, adjust],
    ["adjust -(2^53-1)", "ops", { ...adjust, amount: -maxAmount }, { ...adjust, amount: -maxAmount }],
    ["acquire_slot defaults", "ops", acquire, { ...acquire, leaseMs: 120_000, waitMs: 0 }],
    [
      "acquire_slot system job (empty user)",
      "ops",
      { ...acquire, user: "" },
      { ...acquire, user: "", leaseMs: 120_000, waitMs: 0 }
    ],
    [
      "waitMs 300 000",
      "ops",
      { ...acquire, waitMs: 300_000 },
      { ...acquire, leaseMs: 120_000, waitMs: 300_000 }
    ],
    [
      "renew_slot default lease, empty user",
      "ops",
      { op: "renew_slot", user: "", job: "j" },
      { op: "renew_slot", user: "", job: "j", leaseMs: 120_000 }
    ],
    [
      "release_slot",
      "ops",
      { op: "release_slot", user: "", job: "j" },
      { op: "release_slot", user: "", job: "j" }
    ],
    ["get_usage on ops", "ops", { op: "get_usage", user: "u" }, { op: "get_usage", user: "u" }],
    ["get_usage on admin", "admin", { op: "get_usage", user: "u" }, { op: "get_usage", user: "u" }],
    [
      "set_plan",
      "admin",
      { op: "set_plan", user: "u", plan: "pro" },
      { op: "set_plan", user: "u", plan: "pro" }
    ],
    ["set_limit amount", "admin", setLimit, setLimit],
    [
      "set_limit null returns to the plan",
      "admin",
      { ...setLimit, limit: null },
      { ...setLimit, limit: null }
    ],
    [
      "list_holds: state pending and limit 100 by default",
      "admin",
      { op: "list_holds", user: "u" },
      { op: "list_holds", user: "u", state: "pending", limit: 100 }
    ],
    [
      "list_holds: null state and limit are absent",
      "admin",
      { op: "list_holds", user: "u", state: null, limit: null },
      { op: "list_holds", user: "u", state: "pending", limit: 100 }
    ],
    [
      "list_holds: closed, limit at its bounds (min)",
      "admin",
      { op: "list_holds", user: "u", state: "closed", limit: 1 },
      { op: "list_holds", user: "u", state: "closed", limit: 1 }
    ],
    [
      "list_holds: all, limit at its bounds (max)",
      "admin",
      { op: "list_holds", user: "u", state: "all", limit: 1_000 },
      { op: "list_holds", user: "u", state: "all", limit: 1_000 }
    ]
  ]
  it.each(rows)("%s", (_name, kind, input, expected) => {
    const decoded = decodeCommand(input, kind)
    expect(decoded).toHaveProperty("ok")
    if (Object.keys(expected).length > 0) expect(decoded).toEqual({ ok: expected })
  })

  it("echoes a valid ref, and null ref is absent", () => {
    expect(decodeCommand({ ...consume, ref: "r-1" }, "ops")).toEqual({ ok: consume, ref: "r-1" })
    expect(decodeCommand({ ...consume, ref: bytes256 }, "ops")).toEqual({ ok: consume, ref: bytes256 })
    expect(decodeCommand({ ...consume, ref: null }, "ops")).toEqual({ ok: consume })
  })
})

describe("decodeCommand: each rule's error", () => {
  const rows: Array<[SubjectKind, unknown, string]> = [
    ["ops", null, "command: must be an object"],
    ["ops", [reserve], "command: must be an object"],
    ["ops", "reserve", "command: must be an object"],
    ["ops", { user: "u" }, "op: required"],
    ["ops", { op: null, user: "u" }, "op: required"],
    ["ops", { op: 5, user: "u" }, "op: must be a string"],
    ["ops", { op: "bogus", user: "u" }, 'op: unknown operation "bogus"'],
    ["ops", { op: "tick", user: "u" }, 'op: unknown operation "tick"'],
    ["ops", { op: "RESERVE", user: "u" }, 'op: unknown operation "RESERVE"'],
    ["ops", { op: "set_plan", user: "u", plan: "pro" }, "op: set_plan is sent to .admin, not .ops"],
    ["admin", reserve, "op: reserve is sent to .ops, not .admin"],
    ["ops", { op: "list_holds", user: "u" }, "op: list_holds is sent to .admin, not .ops"],
    ["admin", { op: "list_holds", user: "" }, "user: must not be empty"],
    ["admin", { op: "list_holds", user: "u", state: "open" }, "state: must be pending, closed or all"],
    ["admin", { op: "list_holds", user: "u", state: 1 }, "state: must be pending, closed or all"],
    ["admin", { op: "list_holds", user: "u", limit: 0 }, "limit: must be an integer from 1 to 1000"],
    ["admin", { op: "list_holds", user: "u", limit: 1_001 }, "limit: must be an integer from 1 to 1000"],
    ["admin", { op: "list_holds", user: "u", limit: 2.5 }, "limit: must be an integer from 1 to 1000"],
    ["ops", { ...reserve, user: undefined }, "user: required"],
    ["ops", { ...reserve, user: 5 }, "user: must be a string"],
    ["ops", { ...reserve, user: "" }, "user: must not be empty"],
    ["ops", { op: "get_usage", user: "" }, "user: must not be empty"],
    ["admin", { op: "set_plan", user: "", plan: "pro" }, "user: must not be empty"],
    ["ops", { ...reserve, user: bytes257 }, "user: is 257 UTF-8 bytes, over 256"],
    ["ops", { ...acquire, user: "x".repeat(300) }, "user: is 300 UTF-8 bytes, over 256"],
    ["ops", { ...reserve, user: "a\ud800" }, "user: must be well-formed Unicode (a lone surrogate)"],
    ["ops", { ...reserve, meter: undefined }, "meter: required"],
    ["ops", { ...reserve, meter: 1 }, "meter: must be a string"],
    ["ops", { ...reserve, meter: "Tokens" }, "meter: must match ^[a-z][a-z0-9_]{0,62}$"],
    ["ops", { ...reserve, meter: "1tokens" }, "meter: must match ^[a-z][a-z0-9_]{0,62}$"],
    ["ops", { ...reserve, meter: `a${"b".repeat(63)}` }, "meter: must match ^[a-z][a-z0-9_]{0,62}$"],
    ["ops", { ...reserve, amount: undefined }, "amount: required"],
    ["ops", { ...reserve, amount: -1 }, `amount: must be an integer from 0 to ${maxAmount}`],
    ["ops", { ...reserve, amount: 1.5 }, `amount: must be an integer from 0 to ${maxAmount}`],
    ["ops", { ...reserve, amount: maxAmount + 1 }, `amount: must be an integer from 0 to ${maxAmount}`],
    ["ops", { ...reserve, amount: 1e300 }, `amount: must be an integer from 0 to ${maxAmount}`],
    ["ops", { ...reserve, amount: "5" }, `amount: must be an integer from 0 to ${maxAmount}`],
    ["ops", { ...reserve, amount: true }, `amount: must be an integer from 0 to ${maxAmount}`],
    ["ops", { ...consume, amount: -1 }, `amount: must be an integer from 0 to ${maxAmount}`],
    [
      "ops",
      { op: "commit", user: "u", id: "h", amount: -1 },
      `amount: must be an integer from 0 to ${maxAmount}`
    ],
    [
      "ops",
      { ...adjust, amount: -maxAmount - 1 },
      `amount: must be an integer from -${maxAmount} to ${maxAmount}`
    ],
    ["ops", { ...adjust, amount: 0.5 }, `amount: must be an integer from -${maxAmount} to ${maxAmount}`],
    ["ops", { ...reserve, id: undefined }, "id: required"],
    ["ops", { ...reserve, id: "" }, "id: must not be empty"],
    ["ops", { ...reserve, id: 7 }, "id: must be a string"],
    ["ops", { ...reserve, id: bytes257 }, "id: is 257 UTF-8 bytes, over 256"],
    ["ops", { ...consume, key: undefined }, "key: required"],
    ["ops", { ...consume, key: "" }, "key: must not be empty"],
    ["ops", { ...acquire, job: undefined }, "job: required"],
    ["ops", { ...acquire, job: "" }, "job: must not be empty"],
    ["ops", { ...reserve, ttlMs: 999 }, "ttlMs: must be an integer from 1000 to 86400000"],
    ["ops", { ...reserve, ttlMs: 86_400_001 }, "ttlMs: must be an integer from 1000 to 86400000"],
    ["ops", { op: "extend", user: "u", id: "h" }, "ttlMs: required"],
    ["ops", { ...acquire, leaseMs: 999 }, "leaseMs: must be an integer from 1000 to 3600000"],
    [
      "ops",
      { op: "renew_slot", user: "u", job: "j", leaseMs: 3_600_001 },
      "leaseMs: must be an integer from 1000 to 3600000"
    ],
    ["ops", { ...acquire, waitMs: -1 }, "waitMs: must be an integer from 0 to 300000"],
    ["ops", { ...acquire, waitMs: 300_001 }, "waitMs: must be an integer from 0 to 300000"],
    ["admin", { op: "set_plan", user: "u" }, "plan: required"],
    ["admin", { op: "set_plan", user: "u", plan: 3 }, "plan: must be a string"],
    ["admin", { ...setLimit, limit: undefined }, "limit: required (an amount, or null for the plan's limit)"],
    ["admin", { ...setLimit, limit: -1 }, `limit: must be an integer from 0 to ${maxAmount}`],
    ["admin", { ...setLimit, meter: "Bad" }, "meter: must match ^[a-z][a-z0-9_]{0,62}$"],
    ["ops", { ...reserve, ref: 5 }, "ref: must be a string"],
    ["ops", { ...reserve, ref: bytes257 }, "ref: is 257 UTF-8 bytes, over 256"],
    ["ops", { op: "bogus", ref: [] }, "ref: must be a string"]
  ]
  it.each(rows)("%s %j -> %s", (kind, input, error) => {
    const decoded = decodeCommand(input, kind)
    expect(decoded).toEqual({ invalid: error })
  })

  it("echoes a valid ref on an invalid command, but never an invalid ref", () => {
    expect(decodeCommand({ ...reserve, amount: -1, ref: "r" }, "ops")).toEqual({
      invalid: `amount: must be an integer from 0 to ${maxAmount}`,
      ref: "r"
    })
    expect(decodeCommand({ ...reserve, ref: 1 }, "ops")).not.toHaveProperty("ref")
  })

  it("ignores inherited properties (a JSON __proto__ key is data, not a prototype)", () => {
    const input = JSON.parse('{"__proto__": {"op": "reserve"}, "user": "u"}') as unknown
    expect(decodeCommand(input, "ops")).toEqual({ invalid: "op: required" })
  })
})

describe("judgeCommand: shape, then partition", () => {
  const partitions = 64

  it("sends a command of this partition to the coordinator", () => {
    const p = partitionOf("alice", partitions)
    expect(judgeCommand({ ...reserve, user: "alice" }, "ops", p, partitions)).toEqual({
      submit: { ...reserve, user: "alice", ttlMs: 3_600_000 },
      ref: undefined
    })
  })

  it("answers wrong_partition for another partition's user, with the ref", () => {
    const p = (partitionOf("alice", partitions) + 1) % partitions
    expect(judgeCommand({ ...reserve, user: "alice", ref: "x" }, "ops", p, partitions)).toEqual({
      answer: { status: "wrong_partition" },
      ref: "x"
    })
  })

  it("judges the shape before the partition", () => {
    const p = (partitionOf("alice", partitions) + 1) % partitions
    expect(judgeCommand({ ...reserve, user: "alice", amount: -1 }, "ops", p, partitions)).toMatchObject({
      answer: { status: "invalid_request" }
    })
  })

  it("places a system job (empty user) in partition fnv1a32('') mod P", () => {
    const systemPartition = fnv1a32(new Uint8Array()) % partitions
    expect(systemPartition).toBe(5)
    expect(judgeCommand({ ...acquire, user: "" }, "ops", systemPartition, partitions)).toHaveProperty(
      "submit"
    )
    expect(judgeCommand({ ...acquire, user: "" }, "ops", 0, partitions)).toEqual({
      answer: { status: "wrong_partition" },
      ref: undefined
    })
  })
})

describe("parseBody", () => {
  const encode = (text: string) => new TextEncoder().encode(text)
  it.each([
    ["", "body is not JSON"],
    ["{", "body is not JSON"],
    ["42", "body must be a command object or an array of command objects"],
    ['"x"', "body must be a command object or an array of command objects"],
    ["null", "body must be a command object or an array of command objects"],
    ["true", "body must be a command object or an array of command objects"]
  ])("refuses %j", (text, reason) => {
    const parsed = parseBody(encode(text))
    expect(parsed.kind).toBe("refused")
    if (parsed.kind === "refused") expect(parsed.reason.startsWith(reason)).toBe(true)
  })

  it("refuses invalid UTF-8 rather than guessing", () => {
    expect(parseBody(new Uint8Array([0x7b, 0xff, 0x7d]))).toEqual({
      kind: "refused",
      reason: "body is not UTF-8"
    })
  })

  it("refuses a body over the byte limit and a batch over 1000 commands", () => {
    expect(parseBody(encode("[1,2]"), 4)).toEqual({
      kind: "refused",
      reason: "message of 5 bytes is larger than 4"
    })
    const batch = encode(JSON.stringify(Array.from({ length: 1001 }, () => ({}))))
    expect(parseBody(batch)).toEqual({
      kind: "refused",
      reason: "batch of 1001 commands is over the limit of 1000"
    })
    expect(parseBody(encode(JSON.stringify(Array.from({ length: 1000 }, () => ({})))))).toMatchObject({
      kind: "batch"
    })
  })

  it("takes an object as one command and an array as a batch", () => {
    expect(parseBody(encode('{"op":"x"}'))).toEqual({ kind: "single", command: { op: "x" } })
    expect(parseBody(encode("[]"))).toEqual({ kind: "batch", commands: [] })
  })
})

describe("parseBody: nesting and batch size, judged before JSON.parse", () => {
  const encode = (text: string) => new TextEncoder().encode(text)
  const deepReason = `body nests arrays and objects deeper than ${messageNestingDepthMax} levels`

  /** How deep a parsed value nests: 0 for a scalar, 1 + its deepest child for an array or object. */
  const depthOf = (value: unknown): number =>
    typeof value === "object" && value !== null
      ? 1 + Math.max(0, ...Object.values(value as Record<string, unknown>).map(depthOf))
      : 0

  it("refuses 1 MiB of nested arrays without parsing it, well within 100 ms", () => {
    const half = messageBytesMax / 2
    const nested = encode("[".repeat(half) + "]".repeat(half))
    const started = performance.now()
    const parsed = parseBody(nested)
    const tookMs = performance.now() - started
    console.log(`1 MiB of nested arrays: ${parsed.kind} after ${tookMs.toFixed(2)} ms`)
    expect(parsed).toEqual({ kind: "refused", reason: deepReason })
    expect(tookMs).toBeLessThan(100)
  })

  it("takes nesting up to the limit and refuses one level more", () => {
    const nestedField = (levels: number) => `${"[".repeat(levels)}${"]".repeat(levels)}`
    // A batch (1) of a command (2) whose unknown field nests the rest.
    const atLimit = `[{"op":"get_usage","user":"u","extra":${nestedField(messageNestingDepthMax - 2)}}]`
    expect(parseBody(encode(atLimit))).toMatchObject({ kind: "batch" })
    const overLimit = `[{"op":"get_usage","user":"u","extra":${nestedField(messageNestingDepthMax - 1)}}]`
    expect(parseBody(encode(overLimit))).toEqual({ kind: "refused", reason: deepReason })
  })

  it("does not count brackets, braces or commas inside strings, escaped quotes included", () => {
    const inString = JSON.stringify('[[[[{{{{,,,,\\"[[[['.repeat(20))
    const body = `[{"op":"get_usage","user":${inString}},{"op":"get_usage","user":"b"}]`
    expect(parseBody(encode(body))).toMatchObject({ kind: "batch", commands: [{}, {}] })
  })

  it("refuses a wide batch by counting before parsing", () => {
    const wide = encode(`[${Array.from({ length: 262_143 }, () => "{}").join(",")}]`)
    const started = performance.now()
    const parsed = parseBody(wide)
    const tookMs = performance.now() - started
    console.log(
      `${wide.length} bytes, a batch of 262143 objects: ${parsed.kind} after ${tookMs.toFixed(2)} ms`
    )
    expect(parsed).toEqual({ kind: "refused", reason: "batch of 262143 commands is over the limit of 1000" })
  })

  it("measures any JSON value's depth and top-level length as parsing it would", () => {
    fc.assert(
      fc.property(fc.jsonValue({ maxDepth: 8 }), fc.integer({ min: 1, max: 9 }), (value, depthMax) => {
        const shape = scanBodyShape(encode(JSON.stringify(value)), depthMax)
        expect(shape).toEqual(
          depthOf(value) > depthMax
            ? { nestedTooDeep: true }
            : { nestedTooDeep: false, topLevelElements: Array.isArray(value) ? value.length : undefined }
        )
      }),
      { numRuns: 2_000 }
    )
  })
})
