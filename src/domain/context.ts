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

declare const replyHandleBrand: unique symbol

/**
 * Whoever waits for the answer of a waiting `acquire_slot`: opaque to the domain, which keeps it with
 * the waiter (the one place a waiting job is held) and hands it back in the Wakeup that answers it.
 * The actor gives one per command and answers through it; the domain never calls or reads it.
 */
export interface ReplyHandle {
  readonly [replyHandleBrand]: true
}

/** A handle that answers nobody: for decisions whose caller does not wait (tests of the domain, a tick). */
export const noReplyHandle = (): ReplyHandle => ({}) as ReplyHandle

/** A waiting `acquire_slot` whose answer a decision settled (a slot freed, or its wait ran out). */
export interface Wakeup {
  readonly job: string
  /** The waiter's handle: its answer goes there, once the decision that woke it is durable. */
  readonly reply: ReplyHandle
  readonly result: SlotResult
}

/** What decisions append to while they run. */
export interface Output {
  readonly events: Array<StoreEvent>
  readonly wakeups: Array<Wakeup>
}
