import type { Config } from "./config.js"
import type { StoreEvent } from "./events.js"
import type { SlotResult } from "./results.js"

/** What a decision may read besides the state and the command: injected, never read from the environment. */
export interface DecideContext {
  readonly config: Config
  /** Milliseconds since the Unix epoch. */
  readonly now: number
  /** Uniform in [0, 1): the jitter of `busy`'s retryAfterMs. */
  readonly random: () => number
}

/** A waiting `acquire_slot` whose answer a decision settled (a slot freed, or its wait ran out). */
export interface Wakeup {
  readonly job: string
  readonly result: SlotResult
}

/** What decisions append to while they run. */
export interface Output {
  readonly events: Array<StoreEvent>
  readonly wakeups: Array<Wakeup>
}
