/**
 * PROTOCOL.md revision 1.3, `usage_recorded`: one event per decision that changed a meter's `used`,
 * with the signed change, the period it counts in, its source and reference; none for a decision that
 * changed nothing. Each row decides its `given` commands, then the command under test, and lists the
 * exact `usage_recorded` events the command under test records.
 */
import { describe, expect, it } from "vitest"
import type { Config } from "../../src/domain/config.js"
import { defaultConfig } from "../../src/domain/config.js"
import type { QuotaEvent } from "../../src/domain/events.js"
import { decide } from "../../src/domain/decide.js"
import { emptyUserState } from "../../src/domain/state.js"
import type { Step } from "./support.js"
import { T0, U, adjust, at, commit, consume, release, reserve, runRow, tick } from "./support.js"

const march = Date.UTC(2026, 2, 1)
const april = Date.UTC(2026, 3, 1)

const recorded = (
  fields: Omit<Extract<QuotaEvent, { event: "usage_recorded" }>, "event" | "at" | "periodStart"> & {
    readonly at?: number
    readonly periodStart?: number | null
  }
): QuotaEvent => ({
  event: "usage_recorded",
  meter: fields.meter,
  periodStart: fields.periodStart === undefined ? march : fields.periodStart,
  amount: fields.amount,
  used: fields.used,
  source: fields.source,
  ref: fields.ref,
  ...(fields.key === undefined ? {} : { key: fields.key }),
  at: T0 + (fields.at ?? 0)
})

interface RecordedRow {
  readonly name: string
  readonly given?: ReadonlyArray<Step["command"] | Step>
  readonly when: Step["command"] | Step
  readonly recorded: ReadonlyArray<QuotaEvent>
  readonly status: string
  readonly config?: Config
}

const rows: ReadonlyArray<RecordedRow> = [
  {
    name: "consume: the amount moved from the hold, with its key",
    given: [reserve("h1", 10)],
    when: consume("h1", 4, "k1"),
    status: "consumed",
    recorded: [recorded({ meter: "analysis", amount: 4, used: 4, source: "consume", ref: "h1", key: "k1" })]
  },
  {
    name: "consume retried with the same key: exists, nothing recorded",
    given: [reserve("h1", 10), consume("h1", 4, "k1")],
    when: consume("h1", 4, "k1"),
    status: "exists",
    recorded: []
  },
  {
    name: "consume of 0: consumed, nothing changed, nothing recorded",
    given: [reserve("h1", 10)],
    when: consume("h1", 0, "k0"),
    status: "consumed",
    recorded: []
  },
  {
    name: "commit without amount: the hold's amount charged",
    given: [reserve("h1", 10)],
    when: commit("h1"),
    status: "committed",
    recorded: [recorded({ meter: "analysis", amount: 10, used: 10, source: "commit", ref: "h1" })]
  },
  {
    name: "commit above what was consumed: the rest charged",
    given: [reserve("h1", 10), consume("h1", 4, "k1")],
    when: commit("h1", 7),
    status: "committed",
    recorded: [recorded({ meter: "analysis", amount: 3, used: 7, source: "commit", ref: "h1" })]
  },
  {
    name: "commit below what was consumed: a refund, negative",
    given: [reserve("h1", 10), consume("h1", 6, "k1")],
    when: commit("h1", 2),
    status: "committed",
    recorded: [recorded({ meter: "analysis", amount: -4, used: 2, source: "commit", ref: "h1" })]
  },
  {
    name: "commit equal to what was consumed: nothing changed, nothing recorded",
    given: [reserve("h1", 10), consume("h1", 6, "k1")],
    when: commit("h1", 6),
    status: "committed",
    recorded: []
  },
  {
    name: "commit retried: exists, nothing recorded",
    given: [reserve("h1", 10), commit("h1", 5)],
    when: commit("h1", 5),
    status: "exists",
    recorded: []
  },
  {
    name: "a refund below 0 in a new period: used stays 0, the refund records what it took (nothing)",
    given: [reserve("h1", 10, "analysis", 86_400_000 * 30), consume("h1", 6, "k1")],
    when: at(april - T0, commit("h1", 0)),
    status: "committed",
    recorded: []
  },
  {
    name: "a hold reserved in March committed in April counts in April",
    given: [reserve("h1", 10, "analysis", 86_400_000 * 30)],
    when: at(april - T0 + 1_000, commit("h1", 8)),
    status: "committed",
    recorded: [
      recorded({
        meter: "analysis",
        amount: 8,
        used: 8,
        source: "commit",
        ref: "h1",
        at: april - T0 + 1_000,
        periodStart: april
      })
    ]
  },
  {
    name: "adjust up",
    when: adjust("a1", 25),
    status: "adjusted",
    recorded: [recorded({ meter: "analysis", amount: 25, used: 25, source: "adjust", ref: "a1" })]
  },
  {
    name: "adjust that would go below 0: records what it took back, used 0",
    given: [adjust("a1", 5)],
    when: adjust("a2", -9),
    status: "adjusted",
    recorded: [recorded({ meter: "analysis", amount: -5, used: 0, source: "adjust", ref: "a2" })]
  },
  {
    name: "adjust of 0: adjusted, nothing recorded",
    when: adjust("a1", 0),
    status: "adjusted",
    recorded: []
  },
  {
    name: "adjust retried: exists, nothing recorded",
    given: [adjust("a1", 5)],
    when: adjust("a1", 5),
    status: "exists",
    recorded: []
  },
  {
    name: "adjust at 0 already, downwards: nothing changed, nothing recorded",
    when: adjust("a1", -3),
    status: "adjusted",
    recorded: []
  },
  {
    name: "a `none` meter: periodStart null",
    when: adjust("s1", 1_000, "storage_bytes"),
    status: "adjusted",
    recorded: [
      recorded({
        meter: "storage_bytes",
        amount: 1_000,
        used: 1_000,
        source: "adjust",
        ref: "s1",
        periodStart: null
      })
    ]
  },
  {
    name: "a refusal (over the limit) records nothing",
    when: reserve("h1", 5_001),
    status: "insufficient_quota",
    recorded: []
  },
  {
    name: "reserve and release change no `used`: nothing recorded",
    given: [reserve("h1", 10)],
    when: release("h1"),
    status: "released",
    recorded: []
  },
  {
    name: "a hold that expires after a consume returns only its reservation: nothing recorded",
    given: [reserve("h1", 10, "analysis", 1_000), consume("h1", 3, "k1")],
    when: at(5_000, tick()),
    status: "none",
    recorded: []
  },
  {
    name: "QUOTA_EVENTS_USAGE_RECORDED=false: a charge records none",
    given: [reserve("h1", 10)],
    when: commit("h1"),
    status: "committed",
    recorded: [],
    config: { ...defaultConfig, usageRecordedEvents: false }
  }
]

describe("usage_recorded (revision 1.3): one event per change of used", () => {
  it.each(rows)("$name", (row) => {
    const run = runRow({ ...row, config: row.config ?? defaultConfig })
    expect(run.decision.result?.status ?? "none").toBe(row.status)
    const events = run.decision.events.flatMap((event) =>
      event.kind === "event" && event.event.event === "usage_recorded" ? [event] : []
    )
    for (const event of events) expect(event.user).toBe(U)
    expect(events.map((event) => event.event)).toEqual(row.recorded)
  })

  it("the amounts of a run of changes add up to used, per period, across a month boundary", () => {
    const state = emptyUserState(U)
    const steps: ReadonlyArray<Step> = [
      { command: reserve("h1", 100, "analysis", 86_400_000 * 40) },
      { command: consume("h1", 30, "k1") },
      { command: consume("h1", 20, "k2") },
      { command: adjust("a1", 7) },
      { command: commit("h1", 10), at: april - T0 + 5 },
      { command: adjust("a2", -100), at: april - T0 + 6 },
      { command: adjust("a3", 12), at: april - T0 + 7 }
    ]
    const sums = new Map<number | null, number>()
    let lastUsed = new Map<number | null, number>()
    for (const step of steps) {
      const decision = decide(state, step.command, {
        config: defaultConfig,
        now: T0 + (step.at ?? 0),
        random: () => 0.5
      })
      for (const event of decision.events) {
        if (event.kind !== "event" || event.event.event !== "usage_recorded") continue
        const { periodStart, amount, used } = event.event
        sums.set(periodStart, (sums.get(periodStart) ?? 0) + amount)
        lastUsed = new Map(lastUsed).set(periodStart, used)
      }
    }
    // March: 30 + 20 + 7 = 57; April: the commit refunds 40 (down to 17), -100 takes 17, +12.
    expect(Object.fromEntries(sums)).toEqual({ [march]: 57, [april]: 12 })
    expect(Object.fromEntries(lastUsed)).toEqual({ [march]: 57, [april]: 12 })
  })
})
