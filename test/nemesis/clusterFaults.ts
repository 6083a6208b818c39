/**
 * Faults of what every process shares: the Postgres pair (a standby stall, a failover, a restart of the
 * primary) and the NATS server (a restart). Each returns when healed, with what was done and, for a
 * server that was away, when it was back (the unserved-time bound counts from there: nobody can answer
 * while no server does).
 *
 * The pair's faults run one at a time, whatever the plan says: a stall must not silence the link a new
 * standby is being copied through, and a failover must find a standby in sync.
 */
import { sleep } from "../cluster/cluster.js"
import type { FaultEvent } from "./schedule.js"
import type { NemesisWorld } from "./world.js"
import { followPrimary } from "./world.js"

export interface FaultOutcome {
  readonly what: string
  /** When the server a whole-cluster fault took away answered again (ms since the epoch). */
  readonly backAt?: number
}

/** Per world, the pair's fault in progress: the next waits for it. */
const pairFaults = new WeakMap<NemesisWorld, Promise<unknown>>()

const onePairFaultAtATime = <A>(world: NemesisWorld, fault: () => Promise<A>): Promise<A> => {
  const previous = pairFaults.get(world) ?? Promise.resolve()
  const next = previous.catch(() => undefined).then(fault)
  pairFaults.set(world, next)
  return next
}

export const applyClusterFault = (world: NemesisWorld, event: FaultEvent): Promise<FaultOutcome> => {
  switch (event.kind) {
    case "natsRestart":
      return restartNats(world, event)
    case "standbyStall":
    case "promote":
    case "postgresRestart":
      return onePairFaultAtATime(world, () => applyPairFault(world, event))
    default:
      throw new Error(`${event.kind} is not a fault of the cluster`)
  }
}

const restartNats = async (world: NemesisWorld, event: FaultEvent): Promise<FaultOutcome> => {
  const how = event.variant === "kill" ? "kill" : "term"
  await world.nats.restart(how, event.downMs)
  return {
    what: `NATS server ${how === "kill" ? "killed (SIGKILL)" : "stopped (SIGTERM)"}, started again after ${event.downMs} ms`,
    backAt: Date.now()
  }
}

const applyPairFault = async (world: NemesisWorld, event: FaultEvent): Promise<FaultOutcome> => {
  const pair = world.standby
  if (pair === undefined) return { what: `${event.kind}: no Postgres pair in this world, not applied` }
  switch (event.kind) {
    case "standbyStall": {
      pair.link.silence()
      await sleep(event.durationMs)
      pair.link.resume()
      return { what: `standby link silent for ${event.durationMs} ms: every COMMIT waited, reads answered` }
    }
    case "promote": {
      const started = Date.now()
      if (event.stallMs > 0) {
        // Commits wait for the standby, time out, and their doubts are settled on the primary alone.
        pair.link.silence()
        await sleep(event.stallMs)
      }
      // Lost with whatever it committed that the standby does not have: the link's connections are
      // dropped with what they held (resumed, the silent link would hand the standby the WAL the dead
      // primary had sent into it), and taken again only by the next standby.
      await pair.killPrimary()
      await pair.link.cut()
      await pair.link.restore()
      // No primary at all for a while, as a failover's detection takes (Patroni: its loop).
      await sleep(event.downMs)
      const how = event.variant === "by restart" ? "by restart" : "in place"
      await pair.promoteStandby(how)
      followPrimary(world)
      const backAt = Date.now()
      const promotedMs = backAt - started
      await pair.rebuildStandby()
      return {
        what:
          (event.stallMs > 0 ? `standby link silent for ${event.stallMs} ms, then ` : "") +
          `primary lost (its processes killed), standby promoted ${how} and every address moved to it ` +
          `${promotedMs} ms after the fault began (${event.downMs} ms with no primary); ` +
          `a new synchronous standby in sync ${Date.now() - backAt} ms later`,
        backAt
      }
    }
    case "postgresRestart": {
      const how = event.variant === "fast" ? "fast" : "crash"
      await pair.restartPrimary(how, event.downMs)
      return {
        what: `primary ${how === "crash" ? "crashed (its processes killed)" : "stopped (fast shutdown)"} and started again after ${event.downMs} ms`,
        backAt: Date.now()
      }
    }
    default:
      throw new Error(`${event.kind} is not a fault of the Postgres pair`)
  }
}
