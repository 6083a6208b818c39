/**
 * The nemesis's model (model.ts, judge.ts) on histories written by hand: what it must call wrong, and
 * what it must let pass, with B = 500 ms (a serving clock within 500 ms of the world's), so a hold
 * told to expire at E may expire from E + 500 ms of world time and must have expired by E + 1 500 ms.
 */
import { describe, expect, it } from "vitest"
import type { Call, Reply } from "./history.js"
import { judgeCall, userView } from "./judge.js"
import type { ModelSettings } from "./model.js"

const settings: ModelSettings = {
  clockOffsetMaxMs: 500,
  monthEndAt: undefined,
  periodBefore: undefined,
  slotLimit: 2
}
const user = "nemh-0-1-0"

/** A history: each call [op, flow, input, sentAt, repliedAt, reply fields]. */
const history = (
  ...steps: ReadonlyArray<
    readonly [Call["op"], string, Record<string, number | string>, number, number, Reply]
  >
): Array<Call> =>
  steps.map(([op, flow, input, sentAt, repliedAt, reply], index) => ({
    index,
    op,
    user,
    flow,
    input,
    sentAt,
    repliedAt,
    reply
  }))

const meterView = (used: number, reserved: number, limit = 40) => ({
  meter: "analysis",
  limit,
  used,
  reserved,
  available: limit - used - reserved,
  overage: 0
})
const hold = (id: string, amount: number, consumed: number, state: string, expiresAt: number) => ({
  id,
  amount,
  consumed,
  state,
  expiresAt
})
const limitSet = ["set_limit", "", { limit: 40 }, 0, 10, { status: "ok" }] as const
const reserved = (id: string, amount: number, at: number, ttlMs: number, usedBefore = 0) =>
  [
    "reserve",
    id,
    { amount, ttlMs },
    at,
    at + 10,
    { status: "reserved", ...meterView(usedBefore, amount), ...hold(id, amount, 0, "pending", at + ttlMs) }
  ] as const

const wrongOf = (calls: ReadonlyArray<Call>, model = settings): Array<string> =>
  calls.flatMap((call) => judgeCall(call, userView(calls, model)))

describe("the nemesis's model: holds and the clocks' bound", () => {
  it("finds nothing wrong in a flow answered as the protocol says", () => {
    const calls = history(
      limitSet,
      reserved("h", 4, 100, 2_000),
      [
        "consume",
        "h",
        { amount: 2, key: "h-c1" },
        120,
        130,
        { status: "consumed", ...meterView(2, 2), ...hold("h", 4, 2, "pending", 2_100) }
      ],
      [
        "extend",
        "h",
        { ttlMs: 2_000 },
        140,
        150,
        { status: "extended", ...meterView(2, 2), ...hold("h", 4, 2, "pending", 2_145) }
      ],
      [
        "consume",
        "h",
        { amount: 2, key: "h-c2" },
        160,
        170,
        { status: "consumed", ...meterView(4, 0), ...hold("h", 4, 4, "pending", 2_145) }
      ],
      [
        "commit",
        "h",
        { amount: 4 },
        180,
        190,
        { status: "committed", ...meterView(4, 0), ...hold("h", 4, 4, "committed", 2_145) }
      ]
    )
    expect(wrongOf(calls)).toEqual([])
  })

  it("lets a hold expire from its instant + B of world time, not before", () => {
    const closed = (at: number) =>
      history(limitSet, reserved("h", 4, 100, 1_000), [
        "commit",
        "h",
        { amount: 4 },
        at,
        at + 5,
        { status: "closed", ...meterView(0, 0), ...hold("h", 4, 0, "expired", 1_100) }
      ])
    // Told 1 100: a clock 500 ms ahead reaches 1 100 + 2 x 500 at world time 1 600.
    expect(wrongOf(closed(1_590))).toEqual([
      expect.stringContaining("answered expired, but it expires at 1100 + 2 x 500 ms")
    ])
    expect(wrongOf(closed(1_600))).toEqual([])
  })

  it("lets a reserve whose first attempt's hold expired meanwhile answer closed, once it can have", () => {
    const closed = (at: number) =>
      history(limitSet, [
        "reserve",
        "h",
        { amount: 4, ttlMs: 1_000 },
        100,
        at,
        { status: "closed", ...meterView(0, 0), ...hold("h", 4, 0, "expired", 1_150) }
      ])
    expect(wrongOf(closed(1_640))).toEqual([expect.stringContaining("answered expired at +490 ms")])
    expect(wrongOf(closed(1_650))).toEqual([])
  })

  it("calls a commit of a hold past its instant + 3B wrong: every decision expires what is due first", () => {
    const committed = (at: number) =>
      history(limitSet, reserved("h", 4, 100, 1_000), [
        "commit",
        "h",
        { amount: 4 },
        at,
        at + 5,
        { status: "committed", ...meterView(4, 0), ...hold("h", 4, 4, "committed", 1_100) }
      ])
    expect(wrongOf(committed(2_599))).toEqual([])
    expect(wrongOf(committed(2_600))).toEqual([expect.stringContaining("acted on a hold already closed")])
  })

  it("calls not_found wrong for a hold granted before", () => {
    const calls = history(limitSet, reserved("h", 4, 100, 600_000), [
      "consume",
      "h",
      { amount: 2, key: "h-c1" },
      200,
      210,
      { status: "not_found" }
    ])
    expect(wrongOf(calls)).toEqual(["a hold granted before answered not_found"])
  })
})

describe("the nemesis's model: reads and refusals", () => {
  it("calls a get_usage wrong that misses a hold granted before it was sent", () => {
    const usage = (usedShown: number, reservedShown: number) =>
      history(limitSet, reserved("h", 4, 100, 600_000), [
        "get_usage",
        "",
        {},
        200,
        210,
        {
          status: "ok",
          plan: "free",
          meters: [
            { ...meterView(usedShown, reservedShown), period: "month", periodStart: 0, pendingHolds: 1 }
          ],
          slots: { limit: 2, held: 0, jobs: [], waiting: 0 }
        }
      ])
    expect(wrongOf(usage(0, 4))).toEqual([])
    expect(wrongOf(usage(0, 0))).toEqual(["reserved 0, the model allows 4..4"])
  })

  it("calls a refusal wrong when what certainly stood leaves room for the amount", () => {
    const calls = history(limitSet, reserved("h", 4, 100, 600_000), [
      "reserve",
      "g",
      { amount: 5, ttlMs: 600_000 },
      200,
      210,
      // A stale memory that still counts 33 used: the user has used nothing.
      { status: "insufficient_quota", ...meterView(33, 4), requested: 5, pendingHolds: 1 }
    ])
    expect(wrongOf(calls)).toEqual(["used 33, the model allows 0..0"])
  })

  it("calls a grant an over-grant when what certainly stood leaves no room for it", () => {
    const calls = history(limitSet, reserved("h", 38, 100, 600_000), [
      "reserve",
      "g",
      { amount: 5, ttlMs: 600_000 },
      200,
      210,
      { status: "reserved", ...meterView(0, 5), ...hold("g", 5, 0, "pending", 600_200) }
    ])
    expect(wrongOf(calls)).toContainEqual("over-grant: 5 granted with at least 0 used and 38 reserved of 40")
  })
})

describe("the nemesis's model: a month's end", () => {
  const monthEnd: ModelSettings = { ...settings, monthEndAt: 10_000, periodBefore: 0 }
  const usageAt = (sentAt: number, periodStart: number) =>
    [
      "get_usage",
      "",
      {},
      sentAt,
      sentAt + 10,
      {
        status: "ok",
        plan: "free",
        meters: [{ ...meterView(0, 0), period: "month", periodStart, pendingHolds: 0 }],
        slots: { limit: 2, held: 0, jobs: [], waiting: 0 }
      }
    ] as const

  it("allows the new period only from the month's end - B, and requires it from + B", () => {
    expect(wrongOf(history(limitSet, usageAt(9_480, 10_000)), monthEnd)).toEqual([
      "period 10000, the model allows before the month's end"
    ])
    expect(wrongOf(history(limitSet, usageAt(9_600, 10_000)), monthEnd)).toEqual([])
    expect(wrongOf(history(limitSet, usageAt(10_500, 0)), monthEnd)).toEqual([
      "period 0, the model allows after the month's end"
    ])
  })

  it("never lets a period go back once a decision in the new one was answered", () => {
    expect(wrongOf(history(limitSet, usageAt(9_600, 10_000), usageAt(9_700, 0)), monthEnd)).toEqual([
      "period 0, the model allows after the month's end"
    ])
  })
})

describe("the nemesis's model: slots", () => {
  const acquired = (job: string, at: number, leaseMs: number, held: number) =>
    [
      "acquire_slot",
      job,
      { leaseMs },
      at,
      at + 10,
      { status: "acquired", limit: 2, held, job, leaseExpiresAt: at + leaseMs }
    ] as const

  it("calls busy wrong while a slot is free, and a third grant an over-grant", () => {
    const busy = history(acquired("a", 100, 120_000, 1), [
      "acquire_slot",
      "b",
      { leaseMs: 120_000 },
      200,
      210,
      { status: "busy", limit: 2, held: 2, retryAfterMs: 1_000 }
    ])
    expect(wrongOf(busy)).toEqual([
      "busy, but at most 1 other slots can have been held",
      "held 2, the model allows 1..1"
    ])
    const third = history(
      acquired("a", 100, 120_000, 1),
      acquired("b", 200, 120_000, 2),
      acquired("c", 300, 120_000, 3)
    )
    expect(wrongOf(third)).toContainEqual("granted while 2 other slots were certainly held (limit 2)")
  })

  it("lets a lease end from its instant + B, and calls a renew not_found before that wrong", () => {
    const renew = (at: number) =>
      history(acquired("a", 100, 1_000, 1), [
        "renew_slot",
        "a",
        { leaseMs: 1_000 },
        at,
        at + 5,
        { status: "not_found", limit: 2, held: 0 }
      ])
    expect(wrongOf(renew(1_590))).toEqual([expect.stringContaining("cannot have ended")])
    expect(wrongOf(renew(1_600))).toEqual([])
  })
})
