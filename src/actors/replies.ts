/**
 * A command on its way through a partition actor, with whoever waits for its answer. The envelope is
 * also the reply handle the domain keeps with a waiting `acquire_slot` (its waiter), so a waiting job
 * is held in one place: the user's FIFO queue in its state.
 */
import type { Command } from "../domain/commands.js"
import type { ReplyHandle } from "../domain/context.js"
import type { Result } from "../domain/results.js"
import type { Resident } from "./ResidentUsers.js"

/** Called exactly once with the command's result: the only way a command is answered. */
export type Reply = (result: Result) => void

export interface Envelope {
  /** Replaced once, before its decision, by a `usage_history` carrying the past periods it read. */
  command: Command
  readonly reply: Reply
  /** The user it was queued for (set when it enters a partition actor's inbox). */
  resident: Resident | undefined
  /** Set by the first answer: every later one (a waiter also in a failed batch) is dropped. */
  answered: boolean
}

export const makeEnvelope = (command: Command, reply: Reply): Envelope => ({
  command,
  reply,
  resident: undefined,
  answered: false
})

/** The envelope as the domain holds it: opaque there. */
export const handleOf = (envelope: Envelope): ReplyHandle => envelope as unknown as ReplyHandle

/** The envelope a wakeup hands back (the domain only ever holds handles made by handleOf). */
export const envelopeOf = (handle: ReplyHandle): Envelope => handle as unknown as Envelope

/**
 * Every answer goes through here: once per envelope, and a reply callback that throws is reported, not
 * let loose in the loops that answer the rest of a batch.
 */
export const answer = (
  envelope: Envelope,
  result: Result,
  onError: (user: string, message: string, cause: unknown) => void
): void => {
  if (envelope.answered) return
  envelope.answered = true
  try {
    envelope.reply(result)
  } catch (cause) {
    onError(envelope.command.user, "reply callback threw", cause)
  }
}
