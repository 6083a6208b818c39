import type { Period } from "./config.js"

const dayMs = 86_400_000

/**
 * The month last asked about, [start, next): nearly every decision of a run falls in the same month,
 * and a Date per call was a visible share of a decision's time. A memo of a pure function: the answer
 * does not depend on it.
 */
let monthStart = 0
let nextMonthStart = 0

const monthStartAt = (now: number): number => {
  if (now >= monthStart && now < nextMonthStart) return monthStart
  const date = new globalThis.Date(now)
  const start = globalThis.Date.UTC(date.getUTCFullYear(), date.getUTCMonth(), 1)
  monthStart = start
  nextMonthStart = globalThis.Date.UTC(date.getUTCFullYear(), date.getUTCMonth() + 1, 1)
  return start
}

/** Start of the period containing `now` (UTC): the first of the month, midnight, or null for `none`. */
export const periodStartAt = (period: Period, now: number): number | null => {
  switch (period) {
    case "none":
      return null
    case "day":
      return Math.floor(now / dayMs) * dayMs
    case "month":
      return monthStartAt(now)
  }
}
