/** periodStartAt keeps the month last asked about: asked in any order, it answers as computing afresh would. */
import fc from "fast-check"
import { describe, expect, it } from "vitest"
import { periodStartAt } from "../../src/domain/period.js"

const monthStartFresh = (now: number): number => {
  const date = new Date(now)
  return Date.UTC(date.getUTCFullYear(), date.getUTCMonth(), 1)
}

describe("periodStartAt", () => {
  it("answers the month's start for instants in any order, boundaries included", () => {
    const boundary = Date.UTC(2026, 10, 1)
    for (const now of [
      boundary,
      boundary - 1,
      boundary + 1,
      Date.UTC(2026, 11, 31, 23, 59, 59, 999),
      Date.UTC(2027, 0, 1),
      boundary - 1
    ])
      expect(periodStartAt("month", now)).toBe(monthStartFresh(now))
    fc.assert(
      fc.property(
        fc.array(fc.integer({ min: 0, max: 4_102_444_800_000 }), { minLength: 1, maxLength: 50 }),
        (instants) => {
          for (const now of instants) expect(periodStartAt("month", now)).toBe(monthStartFresh(now))
        }
      )
    )
  })

  it("days start at UTC midnight; none has no period", () => {
    expect(periodStartAt("day", Date.UTC(2026, 10, 25, 13, 5))).toBe(Date.UTC(2026, 10, 25))
    expect(periodStartAt("none", Date.UTC(2026, 10, 25))).toBeNull()
  })
})
