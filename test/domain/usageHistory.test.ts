/**
 * PROTOCOL.md revision 1.3 in the domain: `usage_history` from memory (the current period) and the
 * stored past periods, and the checks of `list_usage` for month, day and `none` meters.
 */
import { describe, expect, it } from "vitest"
import type { ListUsageCommand, UsageHistoryCommand } from "../../src/domain/commands.js"
import type { Config } from "../../src/domain/config.js"
import { defaultConfig } from "../../src/domain/config.js"
import type { PeriodUsage } from "../../src/domain/events.js"
import { decide } from "../../src/domain/decide.js"
import { emptyUserState } from "../../src/domain/state.js"
import { refuseListUsage } from "../../src/domain/usageHistory.js"
import { T0, U, adjust } from "./support.js"

const config: Config = {
  ...defaultConfig,
  meters: [
    { name: "analysis", period: "month" },
    { name: "calls", period: "day" },
    { name: "storage_bytes", period: "none" }
  ],
  plans: { free: { slots: 1, limits: { analysis: 100, calls: 100, storage_bytes: 100 } } },
  defaultPlan: "free"
}
const context = (now: number) => ({ config, now, random: () => 0.5 })
const month = (offset: number) => Date.UTC(2026, 2 + offset, 1)
const day = (offset: number) => Date.UTC(2026, 2, 10 + offset)

const history = (
  command: Omit<UsageHistoryCommand, "op" | "user">,
  past: ReadonlyArray<PeriodUsage> | undefined
) => {
  const state = emptyUserState(U)
  decide(state, adjust("a1", 30), context(T0))
  decide(state, adjust("c1", 4, "calls"), context(T0))
  return decide(
    state,
    { op: "usage_history", user: U, ...command, ...(past === undefined ? {} : { past }) },
    context(T0)
  ).result
}

describe("usage_history", () => {
  it("current period from memory, then stored periods with usage within `periods`, newest first", () => {
    const past: ReadonlyArray<PeriodUsage> = [
      // The current period's stored row may lag memory: memory answers for it.
      { meter: "analysis", periodStart: month(0), used: 10 },
      { meter: "analysis", periodStart: month(-1), used: 8 },
      { meter: "analysis", periodStart: month(-3), used: 5 },
      { meter: "analysis", periodStart: month(-12), used: 2 },
      { meter: "calls", periodStart: day(-1), used: 3 }
    ]
    expect(history({ meter: undefined, periods: 4 }, past)).toEqual({
      status: "ok",
      history: [
        {
          meter: "analysis",
          period: "month",
          periods: [
            { periodStart: month(0), used: 30 },
            { periodStart: month(-1), used: 8 },
            { periodStart: month(-3), used: 5 }
          ]
        },
        {
          meter: "calls",
          period: "day",
          periods: [
            { periodStart: day(0), used: 4 },
            { periodStart: day(-1), used: 3 }
          ]
        }
      ]
    })
    expect(history({ meter: "analysis", periods: 1 }, past)).toEqual({
      status: "ok",
      history: [{ meter: "analysis", period: "month", periods: [{ periodStart: month(0), used: 30 }] }]
    })
  })

  it.each([
    [{ meter: "storage_bytes", periods: 12 }, "invalid_request"],
    [{ meter: "nope", periods: 12 }, "unknown_meter"]
  ])("%j: %s", (command, status) => {
    expect(history(command, [])?.status).toBe(status)
  })

  it("a usage_history decided without its past periods read is a bug: it throws, never answers empty", () => {
    expect(() => history({ meter: "analysis", periods: 12 }, undefined)).toThrow(/past periods/)
  })
})

describe("list_usage checks", () => {
  const now = T0
  const command = (fields: Partial<ListUsageCommand>): ListUsageCommand => ({
    op: "list_usage",
    partition: 0,
    meter: "analysis",
    periodStart: month(0),
    after: undefined,
    limit: 1_000,
    ...fields
  })
  it.each([
    ["the current month", { periodStart: month(0) }, null],
    ["an earlier month", { periodStart: month(-30) }, null],
    ["a month start in 1970", { periodStart: 0 }, null],
    ["the next month", { periodStart: month(1) }, "invalid_request"],
    ["mid-month", { periodStart: month(0) + 86_400_000 }, "invalid_request"],
    ["no periodStart for a month meter", { periodStart: null }, "invalid_request"],
    ["a day meter's day start", { meter: "calls", periodStart: day(-3) }, null],
    ["a day meter's current day", { meter: "calls", periodStart: day(0) }, null],
    ["a day meter's tomorrow", { meter: "calls", periodStart: day(1) }, "invalid_request"],
    ["a day meter mid-day", { meter: "calls", periodStart: day(0) + 3_600_000 }, "invalid_request"],
    ["a none meter, no periodStart", { meter: "storage_bytes", periodStart: null }, null],
    ["a none meter with a periodStart", { meter: "storage_bytes", periodStart: month(0) }, "invalid_request"],
    ["an unknown meter", { meter: "nope" }, "unknown_meter"]
  ])("%s", (_name, fields, status) => {
    expect(refuseListUsage(config, command(fields), now)?.status ?? null).toBe(status)
  })
})
