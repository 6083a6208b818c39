/**
 * A period never goes back: a wall clock that steps back across a period boundary (an NTP step, or a
 * hand-off to a process whose clock lags) must not reset usage, grant the limit again, or write the
 * earlier period's row. Reproduces issue 19's item 2 in the pure domain.
 */
import { describe, expect, it } from "vitest"
import { defaultConfig } from "../../src/domain/config.js"
import { decide } from "../../src/domain/decide.js"
import type { StoreEvent } from "../../src/domain/events.js"
import type { UsageResult } from "../../src/domain/results.js"
import { emptyUserState, userStateFromStored } from "../../src/domain/state.js"
import { commit, getUsage, reserve } from "./support.js"

const aprilFirst = Date.UTC(2026, 3, 1)
const marchFirst = Date.UTC(2026, 2, 1)
/** 1 Apr 00:00:00.200 and, after the clock stepped back, 31 Mar 23:59:59.900. */
const afterBoundary = aprilFirst + 200
const beforeBoundary = aprilFirst - 100

const ctxAt = (now: number) => ({ config: defaultConfig, now, random: () => 0.5 })

const usageRowsOf = (events: ReadonlyArray<StoreEvent>) =>
  events.flatMap((event) => (event.kind === "usage" ? [event] : []))

const analysisOf = (result: unknown) => (result as UsageResult).meters.find((m) => m.meter === "analysis")!

describe("a clock that steps back across a period boundary", () => {
  it("keeps the later period: the limit used in April is not granted again while the clock reads March", () => {
    const state = emptyUserState("u1")
    expect(decide(state, reserve("a", 5_000), ctxAt(afterBoundary)).result?.status).toBe("reserved")
    expect(decide(state, commit("a"), ctxAt(afterBoundary + 100)).result?.status).toBe("committed")

    // The clock steps back 300 ms, across April 1.
    const back = decide(state, reserve("b", 5_000), ctxAt(beforeBoundary))
    expect(back.result?.status).toBe("insufficient_quota")
    const usage = decide(state, getUsage(), ctxAt(beforeBoundary + 10)).result
    expect(analysisOf(usage)).toMatchObject({ periodStart: aprilFirst, used: 5_000, available: 0 })

    // Forward again, still April: nothing more fits either.
    expect(decide(state, reserve("c", 5_000), ctxAt(afterBoundary + 400)).result?.status).toBe(
      "insufficient_quota"
    )
  })

  it("charges a commit decided while the clock reads March to April's row, never March's", () => {
    const state = emptyUserState("u1")
    decide(state, reserve("a", 10), ctxAt(afterBoundary))
    decide(state, commit("a"), ctxAt(afterBoundary + 1))
    decide(state, reserve("b", 20), ctxAt(afterBoundary + 2))
    const committed = decide(state, commit("b"), ctxAt(beforeBoundary))
    expect(committed.result?.status).toBe("committed")
    const rows = usageRowsOf(committed.events)
    expect(rows.map((row) => [row.periodStart, row.used])).toEqual([[aprilFirst, 30]])
    for (const event of committed.events)
      if (event.kind === "ledger") expect(event.periodStart).toBe(aprilFirst)
  })

  it("a process whose clock lags keeps the later period it loads", () => {
    const state = userStateFromStored("u1", {
      plan: null,
      limitOverrides: [],
      usage: [{ meter: "analysis", periodStart: aprilFirst, used: 5_000, thresholdsCrossed: [0.8, 1] }],
      holds: [],
      adjustments: [],
      slots: []
    })
    expect(decide(state, reserve("b", 1), ctxAt(beforeBoundary)).result?.status).toBe("insufficient_quota")
    expect(analysisOf(decide(state, getUsage(), ctxAt(beforeBoundary)).result)).toMatchObject({
      periodStart: aprilFirst,
      used: 5_000
    })
  })

  it("still rolls over when the clock moves forward into a new period", () => {
    const state = emptyUserState("u1")
    decide(state, reserve("a", 5_000), ctxAt(marchFirst + 1_000))
    decide(state, commit("a"), ctxAt(marchFirst + 2_000))
    expect(decide(state, reserve("b", 5_000), ctxAt(afterBoundary)).result?.status).toBe("reserved")
    expect(analysisOf(decide(state, getUsage(), ctxAt(afterBoundary)).result)).toMatchObject({
      periodStart: aprilFirst,
      used: 0,
      reserved: 5_000
    })
  })
})
