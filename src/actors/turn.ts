/**
 * The event loop's current turn as actors see it: from the first decision in this turn (a NATS
 * message's commands, a batch of wakeups) until the loop's next check phase. Actors decide while the
 * turn lasts less than actorTurnMsMax and give the loop back otherwise, so one user's batch of heavy
 * commands (a thousand `list_holds` of a thousand holds each) cannot keep everyone else waiting: the
 * turn is shared by every actor started in it, as they all run inside the same synchronous stretch.
 */
import { actorTurnMsMax } from "../domain/limits.js"

let turnStartedAt = 0
let turnOpen = false

const endTurn = (): void => {
  turnOpen = false
}

/** When the current turn's budget ends (performance.now() ms); opens a turn if none is open. */
export const turnEndsAt = (): number => {
  if (!turnOpen) {
    turnOpen = true
    turnStartedAt = performance.now()
    setImmediate(endTurn)
  }
  return turnStartedAt + actorTurnMsMax
}
