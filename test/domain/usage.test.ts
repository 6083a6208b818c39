/**
 * get_usage with every field, administration (set_plan, set_limit), lowered limits and overage,
 * period rollover at the month and day boundaries (and never for `none`), and amounts near 2^53-1.
 */
import { describe, expect, it } from "vitest"
import type { Config } from "../../src/domain/config.js"
import { defaultConfig } from "../../src/domain/config.js"
import type { Row } from "./support.js"
import {
  acquire,
  adjust,
  at,
  checkRow,
  commit,
  consume,
  getUsage,
  hold,
  holdResult,
  MAX,
  meter,
  release,
  reserve,
  setLimit,
  setPlan,
  T0
} from "./support.js"

const march = Date.UTC(2026, 2, 1)
/** Offsets from T0 (2026-03-10T12:00Z) of the next month and day boundaries. */
const april = Date.UTC(2026, 3, 1) - T0
const midnight = Date.UTC(2026, 2, 11) - T0

const usageMeter = (
  name: string,
  period: "month" | "day" | "none",
  periodStart: number | null,
  limit: number,
  used: number,
  reserved: number,
  pendingHolds: number
) => ({ ...meter(name, limit, used, reserved), period, periodStart, pendingHolds })

const usageRows: Array<Row> = [
  {
    name: "a user never seen: the default plan, every configured meter in configuration order",
    when: getUsage(),
    then: {
      status: "ok",
      plan: "free",
      meters: [
        usageMeter("analysis", "month", march, 5_000, 0, 0, 0),
        usageMeter("specview", "month", march, 5_000, 0, 0, 0),
        usageMeter("tokens", "month", march, 400_000, 0, 0, 0),
        usageMeter("storage_bytes", "none", null, 1_000_000_000, 0, 0, 0)
      ],
      slots: { limit: 1, held: 0, jobs: [], waiting: 0 }
    },
    durable: false
  },
  {
    name: "every field: used, reserved, pendingHolds, slots held with their leases, waiters",
    given: [
      reserve("h1", 30),
      consume("h1", 10, "k1"),
      reserve("h2", 5, "tokens"),
      reserve("h3", 7, "tokens"),
      adjust("a1", 800_000_000, "storage_bytes"),
      acquire("j1"),
      acquire("j2", { waitMs: 60_000 })
    ],
    when: at(1_000, getUsage()),
    then: {
      status: "ok",
      plan: "free",
      meters: [
        usageMeter("analysis", "month", march, 5_000, 10, 20, 1),
        usageMeter("specview", "month", march, 5_000, 0, 0, 0),
        usageMeter("tokens", "month", march, 400_000, 0, 12, 2),
        usageMeter("storage_bytes", "none", null, 1_000_000_000, 800_000_000, 0, 0)
      ],
      slots: { limit: 1, held: 1, jobs: [{ job: "j1", leaseExpiresAt: T0 + 120_000 }], waiting: 1 }
    },
    durable: false
  },
  {
    name: "plan and limits of a pro user, with one override",
    given: [setPlan("pro"), setLimit("tokens", 7)],
    when: getUsage(),
    then: {
      status: "ok",
      plan: "pro",
      meters: [
        usageMeter("analysis", "month", march, 50_000, 0, 0, 0),
        usageMeter("specview", "month", march, 50_000, 0, 0, 0),
        usageMeter("tokens", "month", march, 7, 0, 0, 0),
        usageMeter("storage_bytes", "none", null, 10_000_000_000, 0, 0, 0)
      ],
      slots: { limit: 3, held: 0, jobs: [], waiting: 0 }
    },
    durable: false
  }
]

const adminRows: Array<Row> = [
  { name: "set_plan ok", when: setPlan("pro"), then: { status: "ok" }, durable: true },
  { name: "set_plan unknown_plan", when: setPlan("gold"), then: { status: "unknown_plan" }, durable: false },
  // Names of properties every JavaScript object has are not configured plans.
  ...["constructor", "__proto__", "toString", "hasOwnProperty", "valueOf"].map((plan): Row => ({
    name: `set_plan ${plan} is unknown_plan`,
    when: setPlan(plan),
    then: { status: "unknown_plan" },
    durable: false
  })),
  {
    name: "after a refused set_plan constructor the user still has its plan's limits",
    given: [setPlan("constructor")],
    when: reserve("h1", 11),
    then: holdResult("reserved", meter("analysis", 5_000, 0, 11), hold("h1", 11, 0, "pending", T0 + 60_000)),
    durable: true
  },
  { name: "set_limit ok", when: setLimit("analysis", 10), then: { status: "ok" }, durable: true },
  {
    name: "set_limit unknown_meter",
    when: setLimit("nope", 10),
    then: { status: "unknown_meter" },
    durable: false
  },
  {
    name: "set_limit applies to new holds",
    given: [setLimit("analysis", 10)],
    when: reserve("h1", 11),
    then: { status: "insufficient_quota", requested: 11, pendingHolds: 0, ...meter("analysis", 10, 0, 0) },
    durable: false
  },
  {
    name: "set_limit null returns to the plan's default",
    given: [setLimit("analysis", 10), setLimit("analysis", null)],
    when: reserve("h1", 11),
    then: holdResult("reserved", meter("analysis", 5_000, 0, 11), hold("h1", 11, 0, "pending", T0 + 60_000)),
    durable: true
  },
  {
    name: "a per-user limit stays when the plan changes",
    given: [setLimit("analysis", 10), setPlan("pro")],
    when: reserve("h1", 11),
    then: { status: "insufficient_quota", requested: 11, pendingHolds: 0, ...meter("analysis", 10, 0, 0) },
    durable: false
  },
  {
    name: "set_limit 0 refuses every hold but an amount of 0",
    given: [setLimit("analysis", 0)],
    when: reserve("h1", 0),
    then: holdResult("reserved", meter("analysis", 0, 0, 0), hold("h1", 0, 0, "pending", T0 + 60_000)),
    durable: true
  }
]

const overageRows: Array<Row> = [
  {
    name: "lowering a limit takes nothing back: the hold stays, overage shows the excess",
    given: [setLimit("analysis", 100), reserve("h1", 80), setLimit("analysis", 50)],
    when: consume("h1", 10, "k1"),
    then: holdResult("consumed", meter("analysis", 50, 10, 70), hold("h1", 80, 10, "pending", T0 + 60_000)),
    durable: true
  },
  {
    name: "over the limit, new holds are refused, even of 0",
    given: [setLimit("analysis", 100), reserve("h1", 80), setLimit("analysis", 50)],
    when: reserve("h2", 0),
    then: { status: "insufficient_quota", requested: 0, pendingHolds: 1, ...meter("analysis", 50, 0, 80) },
    durable: false
  },
  {
    name: "back under: new holds again as soon as used + reserved + amount <= limit",
    given: [setLimit("analysis", 100), reserve("h1", 80), setLimit("analysis", 50), release("h1")],
    when: reserve("h2", 50),
    then: holdResult("reserved", meter("analysis", 50, 0, 50), hold("h2", 50, 0, "pending", T0 + 60_000)),
    durable: true
  },
  {
    name: "over through a positive adjust: refused until a refund brings it under",
    given: [setLimit("analysis", 100), adjust("a1", 120), adjust("a2", -30)],
    when: reserve("h1", 10),
    then: holdResult("reserved", meter("analysis", 100, 90, 10), hold("h1", 10, 0, "pending", T0 + 60_000)),
    durable: true
  },
  {
    name: "over through a positive adjust: one more than fits is refused",
    given: [setLimit("analysis", 100), adjust("a1", 120), adjust("a2", -30)],
    when: reserve("h1", 11),
    then: { status: "insufficient_quota", requested: 11, pendingHolds: 0, ...meter("analysis", 100, 90, 0) },
    durable: false
  }
]

const dayConfig: Config = {
  ...defaultConfig,
  meters: [...defaultConfig.meters, { name: "calls", period: "day" }],
  plans: {
    ...defaultConfig.plans,
    free: { slots: 1, limits: { ...defaultConfig.plans.free!.limits, calls: 10 } }
  }
}

const periodRows: Array<Row> = [
  {
    name: "month: used still counts in the last millisecond of the month",
    given: [setLimit("analysis", 100), adjust("a1", 100)],
    when: at(april - 1, reserve("h1", 1)),
    then: { status: "insufficient_quota", requested: 1, pendingHolds: 0, ...meter("analysis", 100, 100, 0) },
    durable: false
  },
  {
    name: "month: used resets at 00:00 UTC on the 1st",
    given: [setLimit("analysis", 100), adjust("a1", 100)],
    when: at(april, reserve("h1", 1)),
    then: holdResult(
      "reserved",
      meter("analysis", 100, 0, 1),
      hold("h1", 1, 0, "pending", T0 + april + 60_000)
    ),
    durable: true
  },
  {
    name: "month: pending holds stay reserved across the boundary",
    given: [
      setLimit("analysis", 100),
      adjust("a1", 50),
      at(april - 1_000, reserve("h1", 30, "analysis", 86_400_000))
    ],
    when: at(april, reserve("h2", 70)),
    then: holdResult(
      "reserved",
      meter("analysis", 100, 0, 100),
      hold("h2", 70, 0, "pending", T0 + april + 60_000)
    ),
    durable: true
  },
  {
    name: "month: a commit after the boundary is usage of the new month",
    given: [
      setLimit("analysis", 100),
      adjust("a1", 50),
      at(april - 1_000, reserve("h1", 30, "analysis", 86_400_000))
    ],
    when: at(april, commit("h1")),
    then: holdResult(
      "committed",
      meter("analysis", 100, 30, 0),
      hold("h1", 30, 30, "committed", T0 + april - 1_000 + 86_400_000)
    ),
    durable: true
  },
  {
    name: "month: get_usage shows the new periodStart and used 0",
    given: [adjust("a1", 50)],
    when: at(april, getUsage()),
    then: {
      status: "ok",
      plan: "free",
      meters: [
        usageMeter("analysis", "month", Date.UTC(2026, 3, 1), 5_000, 0, 0, 0),
        usageMeter("specview", "month", Date.UTC(2026, 3, 1), 5_000, 0, 0, 0),
        usageMeter("tokens", "month", Date.UTC(2026, 3, 1), 400_000, 0, 0, 0),
        usageMeter("storage_bytes", "none", null, 1_000_000_000, 0, 0, 0)
      ],
      slots: { limit: 1, held: 0, jobs: [], waiting: 0 }
    },
    durable: false
  },
  {
    name: "none: a gauge never resets (storage used stays across months)",
    given: [adjust("a1", 800, "storage_bytes")],
    when: at(april + 86_400_000, adjust("a2", -100, "storage_bytes")),
    then: { status: "adjusted", id: "a2", ...meter("storage_bytes", 1_000_000_000, 700, 0) },
    durable: true
  },
  {
    name: "day: used still counts at 23:59:59.999 UTC",
    config: dayConfig,
    given: [adjust("a1", 10, "calls")],
    when: at(midnight - 1, reserve("h1", 1, "calls")),
    then: { status: "insufficient_quota", requested: 1, pendingHolds: 0, ...meter("calls", 10, 10, 0) },
    durable: false
  },
  {
    name: "day: used resets at 00:00 UTC",
    config: dayConfig,
    given: [adjust("a1", 10, "calls")],
    when: at(midnight, reserve("h1", 1, "calls")),
    then: holdResult(
      "reserved",
      meter("calls", 10, 0, 1),
      hold("h1", 1, 0, "pending", T0 + midnight + 60_000)
    ),
    durable: true
  }
]

const overflowRows: Array<Row> = [
  {
    name: "invalid_request: a reserve that would take reserved past 2^53-1",
    given: [setLimit("analysis", MAX), reserve("h1", MAX)],
    when: reserve("h2", 1),
    then: { status: "invalid_request", error: expect.any(String) as unknown as string },
    durable: false
  },
  {
    name: "invalid_request: an adjust that would take used past 2^53-1",
    given: [setLimit("analysis", MAX), adjust("a1", MAX)],
    when: adjust("a2", 1),
    then: { status: "invalid_request", error: expect.any(String) as unknown as string },
    durable: false
  },
  {
    name: "invalid_request: a consume that would take used past 2^53-1",
    given: [setLimit("analysis", MAX), reserve("h1", 1), adjust("a1", MAX - 1)],
    when: consume("h1", 2, "k1"),
    then: { status: "invalid_request", error: expect.any(String) as unknown as string },
    durable: false
  },
  {
    name: "invalid_request: a commit above the hold that would take used past 2^53-1",
    given: [setLimit("analysis", MAX), reserve("h1", 1), adjust("a1", MAX - 1)],
    when: commit("h1", 3),
    then: { status: "invalid_request", error: expect.any(String) as unknown as string },
    durable: false
  },
  {
    name: "adjusted: up to exactly 2^53-1 is an amount",
    given: [setLimit("analysis", MAX), adjust("a1", MAX - 1)],
    when: adjust("a2", 1),
    then: { status: "adjusted", id: "a2", ...meter("analysis", MAX, MAX, 0) },
    durable: true
  },
  {
    name: "consumed: consuming inside a 2^53-1 hold takes neither used nor reserved past 2^53-1",
    given: [setLimit("analysis", MAX), reserve("h1", MAX)],
    when: consume("h1", 1, "k1"),
    then: holdResult(
      "consumed",
      meter("analysis", MAX, 1, MAX - 1),
      hold("h1", MAX, 1, "pending", T0 + 60_000)
    ),
    durable: true
  },
  {
    name: "adjusted, not invalid_request: with reserved = 2^53-1 a charge of 1 takes used only to 1",
    given: [setLimit("analysis", MAX), reserve("h1", MAX)],
    when: adjust("a1", 1),
    then: { status: "adjusted", id: "a1", ...meter("analysis", MAX, 1, MAX) },
    durable: true
  },
  {
    name: "insufficient_quota, not invalid_request: at used = 2^53-1 a hold of 1 takes reserved only to 1",
    given: [setLimit("analysis", MAX), adjust("a1", MAX)],
    when: reserve("h1", 1),
    then: { status: "insufficient_quota", requested: 1, pendingHolds: 0, ...meter("analysis", MAX, MAX, 0) },
    durable: false
  }
]

describe.each([
  ["get_usage", usageRows],
  ["set_plan and set_limit", adminRows],
  ["lowered limits and overage", overageRows],
  ["period rollover", periodRows],
  ["amounts near 2^53-1", overflowRows]
])("%s", (_group, rows) => {
  it.each(rows.map((row) => [row.name, row] as const))("%s", (_name, row) => {
    checkRow(row)
  })
})
