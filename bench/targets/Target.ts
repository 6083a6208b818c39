/**
 * What every system under test implements. A workload speaks in these steps; each target does what its
 * design does for the step, and answers "none" when its design has no request for it (seed 003 has no
 * `consume`: the reservation already deducted the usage), so no latency is recorded for a step that
 * cost nothing.
 */

/** The two meters of the bench: `work` with a limit no workload reaches, `hot` with a tight one. */
export type MeterName = "work" | "hot"

export const meterLimits: Readonly<Record<MeterName, number>> = {
  work: 1_000_000_000_000,
  hot: 100
}

/** Slots per user for the coordinator's `acquire_slot` in the mix (the bench configuration's plan). */
export const slotsPerUser = 3

/**
 * `ok`: granted/applied. `refused`: a decision against the request (insufficient quota, busy slot).
 * `error`: no decision known (timeout, unavailable, overloaded, a driver error). `none`: no request.
 */
export type StepOutcome = "ok" | "refused" | "error" | "none"

export interface HoldRef {
  readonly user: string
  readonly meter: MeterName
  readonly id: string
  readonly amount: number
  /** How much of the hold was consumed before this step. */
  readonly consumed: number
}

export interface Target {
  /** Short key used in file names and ratios, e.g. `seed004`. */
  readonly key: string
  /** Label in the report. */
  readonly label: string
  /** Whether an acknowledged decision survives a crash of the system (fsync'd before the reply). */
  readonly durable: boolean
  readonly supportsSlots: boolean
  /** Said in the report next to the target. */
  readonly notes: ReadonlyArray<string>
  /**
   * Called once per workload before its first run: create users, rows, limits, so the runs measure a
   * warm system, as every target gets. `users` is the workload's user list (empty for hot).
   */
  readonly prime: (users: ReadonlyArray<string>, meter: MeterName) => Promise<void>
  readonly reserve: (hold: HoldRef) => Promise<StepOutcome>
  readonly consume: (hold: HoldRef, amount: number, key: string) => Promise<StepOutcome>
  /** `actual`: the work's total usage, consumption included (at most the hold's amount here). */
  readonly commit: (hold: HoldRef, actual: number) => Promise<StepOutcome>
  readonly release: (hold: HoldRef) => Promise<StepOutcome>
  readonly acquireSlot: (user: string, job: string) => Promise<StepOutcome>
  readonly releaseSlot: (user: string, job: string) => Promise<StepOutcome>
  /** Requests sent so far and, for batching targets, messages: the mean batch is requests / messages. */
  readonly counters: () => { readonly requests: number; readonly messages: number }
  /** A first error message seen, for the report (then cleared). */
  readonly takeError: () => string | undefined
  readonly close: () => Promise<void>
}

/** Remembers the first error text for `takeError`; `guard` answers "error" for a request that throws. */
export const makeErrorNote = () => {
  let first: string | undefined
  const note = (error: unknown) => {
    first ??= error instanceof Error ? error.message : String(error)
  }
  return {
    note,
    guard: async (send: () => Promise<StepOutcome>): Promise<StepOutcome> => {
      try {
        return await send()
      } catch (error) {
        note(error)
        return "error"
      }
    },
    take: () => {
      const taken = first
      first = undefined
      return taken
    }
  }
}

/** Runs `each` on every item, `size` at a time (priming: loading users without flooding the target). */
export const inChunks = async <A>(
  items: ReadonlyArray<A>,
  size: number,
  each: (item: A) => Promise<unknown>
): Promise<void> => {
  for (let start = 0; start < items.length; start += size)
    await Promise.all(items.slice(start, start + size).map(each))
}
