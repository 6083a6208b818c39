import { describe, expect, it } from "vitest"
import { reportingClockSteps } from "../../src/actors/clockSteps.js"

describe("reportingClockSteps", () => {
  it("tells a step back of a second or more once, and returns every reading as read", () => {
    const readings = [10_000, 10_500, 9_900, 8_000, 8_100, 12_000, 10_900]
    const steps: Array<[number, number]> = []
    const now = reportingClockSteps(
      () => readings.shift()!,
      (latest, read) => steps.push([latest, read])
    )
    expect(Array.from({ length: 7 }, () => now())).toEqual([
      10_000, 10_500, 9_900, 8_000, 8_100, 12_000, 10_900
    ])
    expect(steps).toEqual([
      [10_500, 8_000],
      [12_000, 10_900]
    ])
  })
})
