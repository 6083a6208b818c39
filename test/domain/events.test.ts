/**
 * Events (PROTOCOL.md revision 1.1, "Events"): what each decision records for other systems to hear.
 * A row gives the steps before, the command under test and the exact list of events that one decision
 * records (its StoreEvents of kind "event", in order). Only changes record: a refused command, a retry,
 * set_plan to the plan in effect or set_limit to the stored override record nothing.
 *
 * Limits are small (plans below) so the numbers read: `free` has 10 of each meter, `lite` lower limits,
 * `pro` higher ones. Thresholds: analysis and storage_bytes the default [0.8, 1], specview overage
 * alerts [0.5, 1.25], tokens none ([]).
 */
import { describe, expect, it } from "vitest"
import type { Config } from "../../src/domain/config.js"
import { defaultConfig } from "../../src/domain/config.js"
import type { QuotaEvent, StoreEvent } from "../../src/domain/events.js"
import type { Row } from "./support.js"
import {
  acquire,
  adjust,
  at,
  commit,
  consume,
  getUsage,
  release,
  releaseSlot,
  renew,
  reserve,
  runRow,
  setLimit,
  setPlan,
  T0,
  tick,
  U
} from "./support.js"

const small: Config = {
  ...defaultConfig,
  meters: [
    { name: "analysis", period: "month" },
    { name: "specview", period: "month", thresholds: [0.5, 1.25] },
    { name: "tokens", period: "month", thresholds: [] },
    { name: "storage_bytes", period: "none" }
  ],
  plans: {
    free: { slots: 1, limits: { analysis: 10, specview: 10, tokens: 10, storage_bytes: 10 } },
    lite: { slots: 1, limits: { analysis: 5, specview: 10, tokens: 10, storage_bytes: 5 } },
    pro: { slots: 3, limits: { analysis: 100, specview: 100, tokens: 100, storage_bytes: 100 } }
  },
  defaultPlan: "free"
}

const march = Date.UTC(2026, 2, 1)
const april = Date.UTC(2026, 3, 1)
/** Offset from T0 (2026-03-10T12:00Z) of the first millisecond of April. */
const aprilAt = april - T0

interface EventRow extends Pick<Row, "name" | "given" | "when"> {
  /** The exact events the decision under test records, in order. */
  readonly events: ReadonlyArray<QuotaEvent>
  /** The status of the command under test; default: not a refusal (checked loosely). */
  readonly status?: string
  /** Whether the decision writes anything at all (rows or events). */
  readonly durable?: boolean
  /** The thresholds the decision's usage row of a meter remembers as announced in its period. */
  readonly remembered?: Readonly<Record<string, ReadonlyArray<number>>>
  readonly config?: Config
}

/** A usage_threshold of the decision at T0 + ms (default T0); periodStart March unless given. */
const crossed = (
  meter: string,
  threshold: number,
  limit: number,
  used: number,
  options: { at?: number; periodStart?: number | null } = {}
): QuotaEvent => ({
  event: "usage_threshold",
  at: T0 + (options.at ?? 0),
  meter,
  periodStart: options.periodStart === undefined ? march : options.periodStart,
  threshold,
  limit,
  used
})

const holdExpired = (
  id: string,
  amount: number,
  consumed: number,
  returned: number,
  atMs: number,
  meter = "analysis"
): QuotaEvent => ({ event: "hold_expired", at: T0 + atMs, meter, id, amount, consumed, returned })

const slotExpired = (job: string, plan: string, atMs: number): QuotaEvent => ({
  event: "slot_expired",
  at: T0 + atMs,
  job,
  plan
})

const planChanged = (plan: string, previousPlan: string, atMs = 0): QuotaEvent => ({
  event: "plan_changed",
  at: T0 + atMs,
  plan,
  previousPlan
})

const limitChanged = (meter: string, limit: number | null, atMs = 0): QuotaEvent => ({
  event: "limit_changed",
  at: T0 + atMs,
  meter,
  limit
})

const thresholdRows: ReadonlyArray<EventRow> = [
  {
    name: "below 0.8 x limit: nothing",
    when: adjust("a1", 7),
    events: []
  },
  {
    name: "exactly 0.8 x limit (8 of 10) announces 0.8",
    when: adjust("a1", 8),
    events: [crossed("analysis", 0.8, 10, 8)],
    remembered: { analysis: [0.8] }
  },
  {
    name: "one at a time: after 0.8, reaching the limit announces only 1",
    given: [adjust("a1", 8)],
    when: adjust("a2", 2),
    events: [crossed("analysis", 1, 10, 10)],
    remembered: { analysis: [0.8, 1] }
  },
  {
    name: "both in one decision, ascending, with used and limit after it",
    when: adjust("a1", 12),
    events: [crossed("analysis", 0.8, 10, 12), crossed("analysis", 1, 10, 12)],
    remembered: { analysis: [0.8, 1] }
  },
  {
    name: "a consume crosses",
    given: [reserve("h1", 9)],
    when: consume("h1", 9, "k1"),
    events: [crossed("analysis", 0.8, 10, 9)]
  },
  {
    name: "a consume beyond the hold crosses both",
    given: [reserve("h1", 5), consume("h1", 5, "k1")],
    when: consume("h1", 6, "k2"),
    events: [crossed("analysis", 0.8, 10, 11), crossed("analysis", 1, 10, 11)]
  },
  {
    name: "a commit at the hold's amount (the default) crosses",
    given: [reserve("h1", 9)],
    when: commit("h1"),
    events: [crossed("analysis", 0.8, 10, 9)]
  },
  {
    name: "a commit charging more than consumed crosses both",
    given: [reserve("h1", 5), consume("h1", 2, "k1")],
    when: commit("h1", 10),
    events: [crossed("analysis", 0.8, 10, 10), crossed("analysis", 1, 10, 10)]
  },
  {
    name: "a commit below what was consumed is a refund: nothing",
    given: [reserve("h1", 5), consume("h1", 7, "k1")],
    when: commit("h1", 3),
    events: []
  },
  {
    name: "a negative adjust never announces, even standing over a threshold",
    given: [adjust("a1", 9)],
    when: adjust("a2", -1),
    events: []
  },
  {
    name: "a negative adjust past 0 announces nothing",
    given: [adjust("a1", 3)],
    when: adjust("a2", -5),
    events: []
  },
  {
    name: "after a refund, crossing 0.8 again in the period is not repeated",
    given: [adjust("a1", 9), adjust("a2", -5)],
    when: adjust("a3", 5),
    events: []
  },
  {
    name: "after a refund, a threshold never announced still is (and only it)",
    given: [adjust("a1", 9), adjust("a2", -5)],
    when: adjust("a3", 7),
    events: [crossed("analysis", 1, 10, 11)],
    remembered: { analysis: [0.8, 1] }
  },
  {
    name: "after the limit was raised, crossing 0.8 of the new limit is not repeated",
    given: [adjust("a1", 9), setLimit("analysis", 20)],
    when: adjust("a2", 8),
    events: []
  },
  {
    name: "after the limit was raised, 1 of the new limit is announced with it",
    given: [adjust("a1", 9), setLimit("analysis", 20)],
    when: adjust("a2", 12),
    events: [crossed("analysis", 1, 20, 21)]
  },
  {
    name: "a lowered limit crosses: limit_changed first, then the threshold with the new limit",
    given: [adjust("a1", 6)],
    when: setLimit("analysis", 7),
    events: [limitChanged("analysis", 7), crossed("analysis", 0.8, 7, 6)],
    remembered: { analysis: [0.8] }
  },
  {
    name: "a limit lowered below used crosses both",
    given: [adjust("a1", 6)],
    when: setLimit("analysis", 5),
    events: [limitChanged("analysis", 5), crossed("analysis", 0.8, 5, 6), crossed("analysis", 1, 5, 6)]
  },
  {
    name: "a lowered limit does not repeat what was announced: only 1",
    given: [adjust("a1", 9)],
    when: setLimit("analysis", 9),
    events: [limitChanged("analysis", 9), crossed("analysis", 1, 9, 9)]
  },
  {
    name: "a raised limit crosses nothing",
    given: [adjust("a1", 6)],
    when: setLimit("analysis", 50),
    events: [limitChanged("analysis", 50)]
  },
  {
    name: "back to the plan's limit (null) crosses with the plan's limit",
    given: [setLimit("analysis", 20), adjust("a1", 9)],
    when: setLimit("analysis", null),
    events: [limitChanged("analysis", null), crossed("analysis", 0.8, 10, 9)]
  },
  {
    name: "set_plan to lower limits: plan_changed, then each meter's new crossings (none repeated)",
    given: [adjust("a1", 4), adjust("s1", 9, "storage_bytes")],
    when: setPlan("lite"),
    events: [
      planChanged("lite", "free"),
      crossed("analysis", 0.8, 5, 4),
      crossed("storage_bytes", 1, 5, 9, { periodStart: null })
    ],
    remembered: { analysis: [0.8], storage_bytes: [0.8, 1] }
  },
  {
    name: "set_plan to lower limits: a meter with its own limit keeps it and crosses nothing",
    given: [setLimit("analysis", 10), adjust("a1", 4)],
    when: setPlan("lite"),
    events: [planChanged("lite", "free")]
  },
  {
    name: "limit 0 crosses nothing, however much is used",
    given: [setLimit("analysis", 0)],
    when: adjust("a1", 5),
    events: []
  },
  {
    name: "a limit lowered to 0 crosses nothing",
    given: [adjust("a1", 5)],
    when: setLimit("analysis", 0),
    events: [limitChanged("analysis", 0)]
  },
  {
    name: "a new period announces again, with its own periodStart",
    given: [adjust("a1", 9)],
    when: at(aprilAt, adjust("a2", 8)),
    events: [crossed("analysis", 0.8, 10, 8, { at: aprilAt, periodStart: april })],
    remembered: { analysis: [0.8] }
  },
  {
    name: "the last millisecond of the period is still the period: not repeated",
    given: [adjust("a1", 9)],
    when: at(aprilAt - 1, adjust("a2", -9)),
    events: []
  },
  {
    name: "a meter without period (storage) never starts again: periodStart null, nothing repeated",
    given: [adjust("a1", 8, "storage_bytes")],
    when: at(aprilAt, adjust("a2", 2, "storage_bytes")),
    events: [crossed("storage_bytes", 1, 10, 10, { at: aprilAt, periodStart: null })]
  },
  {
    name: "overage alerts [0.5, 1.25]: the limit itself is not a threshold",
    given: [adjust("a1", 6, "specview")],
    when: adjust("a2", 6, "specview"),
    events: []
  },
  {
    name: "overage alerts [0.5, 1.25]: both past 1.25 x limit, ascending",
    when: adjust("a1", 13, "specview"),
    events: [crossed("specview", 0.5, 10, 13), crossed("specview", 1.25, 10, 13)]
  },
  {
    name: "overage alerts: exactly 1.25 x limit (10 of 8)",
    given: [setLimit("specview", 8), adjust("a1", 4, "specview")],
    when: adjust("a2", 6, "specview"),
    events: [crossed("specview", 1.25, 8, 10)]
  },
  {
    name: "thresholds [] announce nothing",
    when: adjust("a1", 50, "tokens"),
    events: []
  },
  {
    name: "thresholds []: a lowered limit records only limit_changed",
    given: [adjust("a1", 9, "tokens")],
    when: setLimit("tokens", 1),
    events: [limitChanged("tokens", 1)]
  },
  {
    name: "a decision at T0 + 5 s carries that time",
    when: at(5_000, adjust("a1", 10)),
    events: [crossed("analysis", 0.8, 10, 10, { at: 5_000 }), crossed("analysis", 1, 10, 10, { at: 5_000 })]
  },
  {
    name: "the default configuration: 0.8 of the free plan's 5 000 analyses",
    config: defaultConfig,
    when: adjust("a1", 4_000),
    events: [crossed("analysis", 0.8, 5_000, 4_000)]
  },
  {
    name: "the default configuration: one below 0.8 x 400 000 tokens",
    config: defaultConfig,
    when: adjust("a1", 319_999, "tokens"),
    events: []
  }
]

const expiryRows: ReadonlyArray<EventRow> = [
  {
    name: "hold_expired at expiresAt (a tick), with the unconsumed rest returned",
    given: [reserve("h1", 6), consume("h1", 2, "k1")],
    when: at(60_000, tick()),
    events: [holdExpired("h1", 6, 2, 4, 60_000)]
  },
  {
    name: "not a millisecond before expiresAt",
    given: [reserve("h1", 6)],
    when: at(59_999, tick()),
    events: [],
    durable: false
  },
  {
    name: "hold_expired at the first decision after expiresAt, at that decision's time",
    given: [reserve("h1", 6, "tokens")],
    when: at(90_000, getUsage()),
    events: [holdExpired("h1", 6, 0, 6, 90_000, "tokens")]
  },
  {
    name: "a hold consumed beyond its amount returns 0",
    given: [reserve("h1", 3), consume("h1", 5, "k1")],
    when: at(60_000, tick()),
    events: [holdExpired("h1", 3, 5, 0, 60_000)]
  },
  {
    name: "expiresAt moved by extend: not at the old time",
    given: [reserve("h1", 3), at(30_000, { op: "extend", user: U, id: "h1", ttlMs: 60_000 })],
    when: at(60_000, tick()),
    events: []
  },
  {
    name: "a committed hold does not expire",
    given: [reserve("h1", 3), commit("h1", 1)],
    when: at(60_000, tick()),
    events: [],
    durable: false
  },
  {
    name: "a released hold does not expire",
    given: [reserve("h1", 3), release("h1")],
    when: at(60_000, tick()),
    events: []
  },
  {
    name: "expired once: the next decision records nothing",
    given: [reserve("h1", 3), at(60_000, tick())],
    when: at(61_000, tick()),
    events: [],
    durable: false
  },
  {
    name: "the expiry is decided before the command: hold_expired, then the command's threshold",
    given: [reserve("h1", 3)],
    when: at(60_000, adjust("a1", 8)),
    events: [holdExpired("h1", 3, 0, 3, 60_000), crossed("analysis", 0.8, 10, 8, { at: 60_000 })]
  },
  {
    name: "a command the expiry makes `closed` still records the expiry",
    given: [reserve("h1", 3)],
    when: at(60_000, commit("h1")),
    events: [holdExpired("h1", 3, 0, 3, 60_000)],
    status: "closed"
  },
  {
    name: "slot_expired when a lease ends, with the plan in effect",
    given: [acquire("j1", { leaseMs: 1_000 })],
    when: at(1_000, tick()),
    events: [slotExpired("j1", "free", 1_000)]
  },
  {
    name: "slot_expired on a pro plan",
    given: [setPlan("pro"), acquire("j1")],
    when: at(130_000, getUsage()),
    events: [slotExpired("j1", "pro", 130_000)]
  },
  {
    name: "the lease ends before a set_plan of the same decision: the old plan, then plan_changed",
    given: [acquire("j1", { leaseMs: 1_000 })],
    when: at(1_000, setPlan("pro")),
    events: [slotExpired("j1", "free", 1_000), planChanged("pro", "free", 1_000)]
  },
  {
    name: "a renewed lease does not end at the old time",
    given: [acquire("j1", { leaseMs: 1_000 }), at(500, renew("j1", 5_000))],
    when: at(1_000, tick()),
    events: []
  },
  {
    name: "a released slot does not expire",
    given: [acquire("j1", { leaseMs: 1_000 }), releaseSlot("j1")],
    when: at(1_000, tick()),
    events: [],
    durable: false
  },
  {
    name: "a lease that ends hands the slot to a waiter: only the ended one is announced",
    given: [acquire("j1", { leaseMs: 1_000 }), acquire("j2", { waitMs: 5_000 })],
    when: at(1_000, tick()),
    events: [slotExpired("j1", "free", 1_000)]
  }
]

const adminRows: ReadonlyArray<EventRow> = [
  {
    name: "set_plan to another plan: plan_changed with the previous (default) plan",
    when: setPlan("pro"),
    events: [planChanged("pro", "free")]
  },
  {
    name: "set_plan back: previousPlan is the plan set before",
    given: [setPlan("pro")],
    when: setPlan("free"),
    events: [planChanged("free", "pro")]
  },
  {
    name: "set_plan to the plan set before: nothing (the plan row is still written)",
    given: [setPlan("pro")],
    when: setPlan("pro"),
    events: [],
    durable: true
  },
  {
    name: "set_plan to the default plan for a user never set: nothing (the plan row is still written)",
    when: setPlan("free"),
    events: [],
    durable: true
  },
  {
    name: "set_limit to a value: limit_changed",
    when: setLimit("analysis", 7),
    events: [limitChanged("analysis", 7)]
  },
  {
    name: "set_limit to the plan's own limit, with no override stored: an override is now stored",
    when: setLimit("analysis", 10),
    events: [limitChanged("analysis", 10)]
  },
  {
    name: "set_limit to another value: limit_changed",
    given: [setLimit("analysis", 7)],
    when: setLimit("analysis", 8),
    events: [limitChanged("analysis", 8)]
  },
  {
    name: "set_limit back to none: limit_changed with null",
    given: [setLimit("analysis", 7)],
    when: setLimit("analysis", null),
    events: [limitChanged("analysis", null)]
  },
  {
    name: "set_limit to the stored value again: nothing, no row",
    given: [setLimit("analysis", 7)],
    when: setLimit("analysis", 7),
    events: [],
    durable: false
  },
  {
    name: "set_limit null with no override stored: nothing, no row",
    when: setLimit("analysis", null),
    events: [],
    durable: false
  },
  {
    name: "set_limit null twice: the second changes nothing",
    given: [setLimit("analysis", 7), setLimit("analysis", null)],
    when: setLimit("analysis", null),
    events: [],
    durable: false
  }
]

const refusedRows: ReadonlyArray<EventRow> = [
  {
    name: "insufficient_quota: nothing",
    given: [adjust("a1", 7)],
    when: reserve("h1", 4),
    events: [],
    status: "insufficient_quota",
    durable: false
  },
  {
    name: "unknown_plan: nothing",
    when: setPlan("gold"),
    events: [],
    status: "unknown_plan",
    durable: false
  },
  {
    name: "unknown_meter on set_limit: nothing",
    when: setLimit("nope", 1),
    events: [],
    status: "unknown_meter",
    durable: false
  },
  {
    name: "an adjust retried (exists): nothing again",
    given: [adjust("a1", 9)],
    when: adjust("a1", 9),
    events: [],
    status: "exists",
    durable: false
  },
  {
    name: "a consume retried with its key (exists): nothing again",
    given: [reserve("h1", 9), consume("h1", 9, "k1")],
    when: consume("h1", 9, "k1"),
    events: [],
    status: "exists",
    durable: false
  },
  {
    name: "a commit retried (exists): nothing again",
    given: [reserve("h1", 9), commit("h1")],
    when: commit("h1"),
    events: [],
    status: "exists",
    durable: false
  },
  {
    name: "an adjust that would pass 2^53-1 (invalid_request): nothing",
    given: [adjust("a1", 9)],
    when: adjust("a2", Number.MAX_SAFE_INTEGER),
    events: [],
    status: "invalid_request",
    durable: false
  },
  {
    name: "reads record nothing",
    given: [adjust("a1", 9)],
    when: getUsage(),
    events: [],
    durable: false
  }
]

/**
 * PROTOCOL.md: a threshold is crossed when `used >= threshold x limit`; thresholds are decimal fractions
 * of the limit from the configuration file. 1.1 x 50 is 55 and 0.55 x 100 is 55, but in binary floating
 * point both products are 55.00000000000001, so `used` 55 is taken as below them.
 */
const decimalRows: ReadonlyArray<EventRow> = [
  {
    name: "an overage alert at 1.1: 55 of 50 is 1.1 x limit",
    config: { ...small, meters: [{ name: "analysis", period: "month", thresholds: [1.1] }] },
    given: [setLimit("analysis", 50)],
    when: adjust("a1", 55),
    events: [crossed("analysis", 1.1, 50, 55)]
  },
  {
    name: "0.55: 55 of 100 is 0.55 x limit",
    config: { ...small, meters: [{ name: "analysis", period: "month", thresholds: [0.55] }] },
    given: [setLimit("analysis", 100)],
    when: adjust("a1", 55),
    events: [crossed("analysis", 0.55, 100, 55)]
  }
]

/** The events of the kinds this table is about: `usage_recorded` has its own (test/domain/usageRecorded.test.ts). */
const quotaEvents = (events: ReadonlyArray<StoreEvent>): Array<QuotaEvent> =>
  events.flatMap((event) => {
    if (event.kind !== "event" || event.event.event === "usage_recorded") return []
    expect(event.user).toBe(U)
    return [event.event]
  })

const checkEventRow = (row: EventRow): void => {
  const run = runRow({ ...row, config: row.config ?? small })
  for (const [index, result] of run.givenResults.entries()) {
    expect(
      ["invalid_request", "unavailable", "overloaded", "insufficient_quota", "unknown_plan", "unknown_meter"],
      `given #${index} answered ${JSON.stringify(result)}`
    ).not.toContain(result?.status)
  }
  const status = run.decision.result?.status
  if (row.status !== undefined) expect(status).toBe(row.status)
  else
    expect(["invalid_request", "insufficient_quota", "unknown_plan", "unknown_meter"]).not.toContain(status)
  expect(quotaEvents(run.decision.events)).toEqual(row.events)
  if (row.durable !== undefined) {
    expect(run.decision.events.length > 0, `writes: ${JSON.stringify(run.decision.events)}`).toBe(row.durable)
  }
  for (const [meter, thresholds] of Object.entries(row.remembered ?? {})) {
    const rows = run.decision.events.filter(
      (event): event is Extract<StoreEvent, { kind: "usage" }> =>
        event.kind === "usage" && event.meter === meter
    )
    expect(rows.at(-1)?.thresholdsCrossed, `the decision's usage row of ${meter}`).toEqual(thresholds)
  }
}

describe("events: usage_threshold", () => {
  it.each(thresholdRows)("$name", checkEventRow)
})

describe("events: hold_expired and slot_expired", () => {
  it.each(expiryRows)("$name", checkEventRow)
})

describe("events: plan_changed and limit_changed", () => {
  it.each(adminRows)("$name", checkEventRow)
})

describe("events: refused commands and retries record nothing", () => {
  it.each(refusedRows)("$name", checkEventRow)
})

describe("events: thresholds are decimal fractions of the limit (fails: see decimalRows)", () => {
  it.each(decimalRows)("$name", checkEventRow)
})
