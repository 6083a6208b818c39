import type { Period } from "./config.js"

const dayMs = 86_400_000

/** Start of the period containing `now` (UTC): the first of the month, midnight, or null for `none`. */
export const periodStartAt = (period: Period, now: number): number | null => {
  switch (period) {
    case "none":
      return null
    case "day":
      return Math.floor(now / dayMs) * dayMs
    case "month": {
      const date = new globalThis.Date(now)
      return globalThis.Date.UTC(date.getUTCFullYear(), date.getUTCMonth(), 1)
    }
  }
}
