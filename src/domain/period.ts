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

/** The start of the period `count` periods before the one starting at `start` (a month or day start). */
export const periodStartBack = (period: "month" | "day", start: number, count: number): number => {
  if (period === "day") return start - count * dayMs
  const date = new globalThis.Date(start)
  return globalThis.Date.UTC(date.getUTCFullYear(), date.getUTCMonth() - count, 1)
}

/** Whether `at` is the start of one of the period's periods (UTC midnight; and the 1st, for months). */
export const isPeriodStart = (period: "month" | "day", at: number): boolean =>
  at >= 0 && periodStartAt(period, at) === at
