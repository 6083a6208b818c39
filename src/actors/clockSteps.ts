/**
 * Wall-clock readings as decisions see them, with a step back told once per step. Decisions use the
 * wall clock (periods are calendar months and days); a clock that steps back (an NTP correction, a VM
 * restored) is survived by the domain, where a period never goes back (state.ts, periodRolledOver),
 * and by expiry, which only compares instants. This only makes the step visible to operators.
 */

/** A step back smaller than this is ordinary jitter between readings, not worth a line. */
export const clockStepBackReportedMinMs = 1_000

export const reportingClockSteps = (
  read: () => number,
  onStepBack: (latestMs: number, readMs: number) => void
): (() => number) => {
  let latest = -Infinity
  return () => {
    const now = read()
    if (now >= latest) latest = now
    else if (latest - now >= clockStepBackReportedMinMs) {
      onStepBack(latest, now)
      // Reported once: later readings are compared with this one.
      latest = now
    }
    return now
  }
}
