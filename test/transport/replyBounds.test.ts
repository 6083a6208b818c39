/**
 * Replies are bounded as they are built, through real NATS: `list_holds` of a user whose 1 000 holds
 * have ids of 256 control characters (1 506 bytes each once escaped as JSON) stops within
 * holdListReplyBytesMax and says `more: true`, instead of building a reply of megabytes that NATS
 * cannot carry; a batch whose results together pass the server's max payload gets the 400 service
 * error PROTOCOL.md lists (an empty body and a reason), never a code it does not.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { holdListReplyBytesMax } from "../../src/domain/limits.js"
import type { Harness } from "./support.js"
import { startHarness } from "./support.js"

let harness: Harness
const hoarder = "hoarder"
const holdCount = 1_000
/** 256 UTF-8 bytes, 1 506 once JSON escapes its control characters; sorts by its number. */
const longId = (index: number) => `${String(index).padStart(6, "0")}${"\u0001".repeat(250)}`

const reserveAll = async (user: string, ids: ReadonlyArray<string>) => {
  for (let start = 0; start < ids.length; start += 100) {
    const batch = ids
      .slice(start, start + 100)
      .map((id) => ({ op: "reserve", user, meter: "tokens", amount: 1, id }))
    const results = (await harness.call(user, batch)) as Array<{ status: string }>
    expect(results.every((result) => result.status === "reserved")).toBe(true)
  }
}

beforeAll(async () => {
  harness = await startHarness({ label: "replybounds" })
  await reserveAll(
    hoarder,
    Array.from({ length: holdCount }, (_, index) => longId(index))
  )
  await reserveAll(
    "plain",
    Array.from({ length: holdCount }, (_, index) => `h-${String(index).padStart(4, "0")}`)
  )
}, 60_000)

afterAll(() => harness?.close())

const listAll = { op: "list_holds", state: "all", limit: 1_000 }

describe("list_holds: bounded in bytes", () => {
  it("stops before the bound with more: true when the holds' JSON would pass it", async () => {
    const reply = await harness.request(
      harness.subject(hoarder, "admin"),
      JSON.stringify({ ...listAll, user: hoarder })
    )
    expect(reply.headers?.get("Nats-Service-Error-Code") ?? null).toBe(null)
    const listed = reply.body as { status: string; holds: Array<{ id: string }>; more: boolean }
    console.log(
      `list_holds of 1000 holds with 256-byte control-character ids: ${listed.holds.length} listed, ${reply.bytes} bytes`
    )
    expect(listed.status).toBe("ok")
    expect(listed.more).toBe(true)
    expect(listed.holds.length).toBeGreaterThan(0)
    expect(listed.holds.length).toBeLessThan(holdCount)
    expect(listed.holds.map((hold) => hold.id)).toEqual(
      Array.from({ length: listed.holds.length }, (_, index) => longId(index))
    )
    expect(reply.bytes).toBeLessThanOrEqual(holdListReplyBytesMax + 100)
    // One more hold would have passed the bound.
    const holdBytes =
      (reply.bytes - JSON.stringify({ status: "ok", holds: [], more: true }).length) / listed.holds.length
    expect(reply.bytes + holdBytes).toBeGreaterThan(holdListReplyBytesMax)
  })

  it("lists 1000 holds of ordinary ids whole", async () => {
    const listed = (await harness.call("plain", { ...listAll, user: "plain" }, "admin")) as {
      holds: Array<unknown>
      more: boolean
    }
    expect(listed.holds).toHaveLength(holdCount)
    expect(listed.more).toBe(false)
  })
})

describe("a reply past the server's max payload", () => {
  it("is the 400 service error with a reason, and the connection goes on", async () => {
    const maxPayload = harness.client.info?.max_payload ?? 1_048_576
    const copies = Math.ceil(maxPayload / holdListReplyBytesMax) + 1
    const batch = Array.from({ length: copies }, () => ({ ...listAll, user: hoarder }))
    const reply = await harness.request(harness.subject(hoarder, "admin"), JSON.stringify(batch))
    expect(reply.bytes).toBe(0)
    expect(reply.headers?.get("Nats-Service-Error-Code")).toBe("400")
    expect(reply.headers?.get("Nats-Service-Error")).toContain(
      `reply larger than the max payload of ${maxPayload} bytes`
    )
    // Fewer per message are answered.
    const two = (await harness.call(
      hoarder,
      [
        { ...listAll, user: hoarder },
        { ...listAll, user: hoarder }
      ],
      "admin"
    )) as Array<{ status: string; more: boolean }>
    expect(two.map((result) => [result.status, result.more])).toEqual([
      ["ok", true],
      ["ok", true]
    ])
  })
})
