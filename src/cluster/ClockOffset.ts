/**
 * How far this process's wall clock is from Postgres's, and whether that is within the bound
 * (`QUOTA_CLOCK_OFFSET_MAX_MS`), as CockroachDB's maximum clock offset. Leases and heartbeats run on
 * Postgres's clock, decisions on this process's: a process further off than the bound answers for no
 * partition and gives them up (src/cluster/PartitionOwnership.ts), so the decisions of those that serve
 * can rely on their clocks differing by at most twice the bound (src/domain/config.ts clockSkewMaxMs).
 *
 * Each ownership round reads Postgres's clock between two readings of the local one (NTP's way): the
 * offset is the local midpoint minus the server's reading, known within half the round trip. Between
 * two measurements the wall clock is compared with the monotonic one: a step of the wall clock (an NTP
 * step, a VM restored, a hand set) moves the offset at once, without waiting for the next round.
 */
import { Effect } from "effect"
import { clockSamplesPerMeasurementMax } from "../domain/limits.js"

export interface ClockOffsetState {
  /** The bound, in ms. */
  readonly offsetMaxMs: number
  /** The wall clock decisions read (Date.now; tests inject one that is off). */
  readonly wallNow: () => number
  readonly monotonicNow: () => number
  /** Local minus Postgres's clock at the last trusted measurement (positive: this one is ahead). */
  measuredOffsetMs: number | undefined
  /** Half the round trip of that measurement: the offset is known within this. */
  uncertaintyMs: number
  /** wall - monotonic at that measurement: how far the wall clock moved since is added to the offset. */
  wallMinusMonotonicMs: number
  /** Why the process was last found beyond the bound (undefined: within), as last reported. */
  beyond: string | undefined
}

export const makeClockOffsetState = (
  offsetMaxMs: number,
  wallNow: () => number = Date.now,
  monotonicNow: () => number = () => performance.now()
): ClockOffsetState => ({
  offsetMaxMs,
  wallNow,
  monotonicNow,
  measuredOffsetMs: undefined,
  uncertaintyMs: 0,
  wallMinusMonotonicMs: 0,
  beyond: undefined
})

/** The offset now (local minus Postgres's): the measured one plus how far the wall clock stepped since. */
export const clockOffsetNowMs = (clock: ClockOffsetState): number | undefined =>
  clock.measuredOffsetMs === undefined
    ? undefined
    : clock.measuredOffsetMs + (clock.wallNow() - clock.monotonicNow() - clock.wallMinusMonotonicMs)

/** Whether the clock is within the bound now, uncertainty included; false until first measured. Allocates nothing. */
export const clockWithinBound = (clock: ClockOffsetState): boolean => {
  const offsetMs = clockOffsetNowMs(clock)
  return offsetMs !== undefined && Math.abs(offsetMs) + clock.uncertaintyMs <= clock.offsetMaxMs
}

/** Why the clock is not within the bound now, for the log; undefined when it is. */
export const clockBeyondReason = (clock: ClockOffsetState): string | undefined => {
  if (clockWithinBound(clock)) return undefined
  const offsetMs = clockOffsetNowMs(clock)
  if (offsetMs === undefined) return "the clock's offset from Postgres's is not known yet"
  return (
    `this process's clock is ${Math.round(Math.abs(offsetMs))} ms ` +
    `${offsetMs > 0 ? "ahead of" : "behind"} Postgres's (within ${Math.ceil(clock.uncertaintyMs)} ms), ` +
    `beyond QUOTA_CLOCK_OFFSET_MAX_MS (${clock.offsetMaxMs} ms)`
  )
}

/**
 * Reads Postgres's clock up to clockSamplesPerMeasurementMax times (fewer once one is precise enough)
 * and keeps the reading with the shortest round trip. It replaces the last measurement only when its
 * uncertainty is at most half the bound: a reading delayed by a busy server or network says little,
 * and the previous one (followed by the wall-against-monotonic check) stands meanwhile. Returns whether
 * the new reading was taken.
 */
export const measureClockOffset = <E>(
  clock: ClockOffsetState,
  readServerMs: Effect.Effect<number, E>
): Effect.Effect<boolean, E> =>
  Effect.gen(function* () {
    let best: { offsetMs: number; uncertaintyMs: number; wallMinusMonotonicMs: number } | undefined
    for (let sample = 0; sample < clockSamplesPerMeasurementMax; sample += 1) {
      const before = clock.wallNow()
      const monotonicBefore = clock.monotonicNow()
      const serverMs = yield* readServerMs
      // The round trip on the monotonic clock: a wall-clock step during the reading cannot shorten it.
      const uncertaintyMs = (clock.monotonicNow() - monotonicBefore) / 2
      if (best === undefined || uncertaintyMs < best.uncertaintyMs) {
        best = {
          offsetMs: before + uncertaintyMs - serverMs,
          uncertaintyMs,
          wallMinusMonotonicMs: before - monotonicBefore
        }
      }
      if (best.uncertaintyMs <= clock.offsetMaxMs / 10) break
    }
    if (best === undefined || best.uncertaintyMs > clock.offsetMaxMs / 2) return false
    clock.measuredOffsetMs = best.offsetMs
    clock.uncertaintyMs = best.uncertaintyMs
    clock.wallMinusMonotonicMs = best.wallMinusMonotonicMs
    return true
  })
