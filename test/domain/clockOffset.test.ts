/**
 * Two processes decide for one user in turn (an owner, then a new owner after a hand-over), each on its
 * own clock, within QUOTA_CLOCK_OFFSET_MAX_MS of Postgres's. A deadline the first set (a slot's lease, a
 * hold's expiry) must not be acted on by the second before it has passed on the first's clock: the
 * slot's job, or the hold's work, still runs, and freeing it early grants its capacity twice.
 */
import { describe, expect, it } from "vitest"
import type { Config } from "../../src/domain/config.js"
import { clockSkewMaxMs, defaultConfig } from "../../src/domain/config.js"
import { decide } from "../../src/domain/decide.js"
import type { Command } from "../../src/domain/commands.js"
import {
  clockOffsetMaxMsDefault,
  clockOffsetMaxMsMax,
  consumeKeyClockSlackMs
} from "../../src/domain/limits.js"
import type { UserState } from "../../src/domain/state.js"
import { emptyUserState } from "../../src/domain/state.js"
import { acquire, reserve, setLimit, T0, U } from "./support.js"

const config: Config = { ...defaultConfig, clockOffsetMaxMs: clockOffsetMaxMsDefault }
const skewMs = clockSkewMaxMs(config)
const leaseMs = 10_000
const ttlMs = 10_000

const decideAt = (state: UserState, now: number, command: Command) =>
  decide(state, command, { config, now, random: () => 0.5 }, { assertFull: true })

interface Row {
  /** How far the new owner's clock runs ahead of the first owner's. */
  readonly aheadMs: number
  /** The real time of the new owner's decision, after the deadline the first owner set. */
  readonly afterDeadlineMs: number
  /** Whether the deadline may be acted on then. */
  readonly due: boolean
}

// Real time just before the deadline, with the new owner ahead by up to the most two clocks within the
// bound can differ (twice the maximum offset); and well past it, when the slot must be freed.
const rows: ReadonlyArray<Row> = [
  { aheadMs: 1, afterDeadlineMs: -1, due: false },
  { aheadMs: clockOffsetMaxMsDefault - 1, afterDeadlineMs: -1, due: false },
  { aheadMs: clockOffsetMaxMsDefault, afterDeadlineMs: -100, due: false },
  { aheadMs: skewMs, afterDeadlineMs: -1, due: false },
  { aheadMs: 0, afterDeadlineMs: 0, due: false },
  { aheadMs: skewMs, afterDeadlineMs: 0, due: true },
  { aheadMs: 0, afterDeadlineMs: skewMs, due: true }
]

const label = (row: Row) =>
  `new owner ${row.aheadMs} ms ahead, at ${row.afterDeadlineMs} ms from the deadline: ${row.due ? "due" : "not due"}`

describe("a new owner whose clock runs ahead (within the bound)", () => {
  it.each(rows)("slots: %s", (row) => {
    const state = emptyUserState(U)
    // First owner, on its own clock (= real time here): the plan's one slot.
    const granted = decideAt(state, T0, acquire("j1", { leaseMs }))
    expect(granted.result).toMatchObject({ status: "acquired", leaseExpiresAt: T0 + leaseMs })
    // New owner, its clock `aheadMs` ahead, at real time `afterDeadlineMs` from the lease's end.
    const realMs = T0 + leaseMs + row.afterDeadlineMs
    const second = decideAt(state, realMs + row.aheadMs, acquire("j2", { leaseMs }))
    const held = [...state.slots.keys()]
    if (row.due) {
      expect(second.result).toMatchObject({ status: "acquired" })
      expect(held).toEqual(["j2"])
    } else {
      // j1's lease has not ended on the clock that granted it: its job still runs. A second slot now
      // would make the user hold two against its plan's one.
      expect({ label: label(row), status: second.result?.status, held }).toEqual({
        label: label(row),
        status: "busy",
        held: ["j1"]
      })
    }
  })

  it.each(rows)("holds: %s", (row) => {
    const state = emptyUserState(U)
    decideAt(state, T0, setLimit("analysis", 100))
    expect(decideAt(state, T0, reserve("h1", 100, "analysis", ttlMs)).result?.status).toBe("reserved")
    const realMs = T0 + ttlMs + row.afterDeadlineMs
    const second = decideAt(state, realMs + row.aheadMs, reserve("h2", 100, "analysis", ttlMs))
    if (row.due) {
      expect(second.result?.status).toBe("reserved")
    } else {
      // h1's work may still commit on time: its 100 is not free to grant again.
      expect({ label: label(row), status: second.result?.status, h1: state.pending.has("h1") }).toEqual({
        label: label(row),
        status: "insufficient_quota",
        h1: true
      })
    }
  })

  it("consume keys survive a reload whatever two clocks within the bound read", () => {
    expect(2 * clockOffsetMaxMsMax).toBeLessThan(consumeKeyClockSlackMs)
  })
})
