/**
 * The open loop: cycles start at a fixed arrival rate (Poisson arrivals from a seeded rng), whether or
 * not earlier cycles have been answered, as a service's callers do. A closed loop slows down with the
 * system under test and so hides its queueing (coordinated omission); here a slow reply leaves the
 * next arrivals waiting, and their latency shows it, because the first request of a cycle is timed
 * from the cycle's *intended* start (its place in the schedule), not from when it was sent. Later
 * requests of the cycle are timed from when they were sent: each follows its predecessor's reply.
 *
 * Cycles in flight are capped: an arrival that finds the cap reached is not started and is counted as
 * dropped. Warm-up, measured window, tally, errors and CPU shares are the closed loop's (driver.ts).
 */
import { performance } from "node:perf_hooks"
import type { Runner, SessionPlan } from "./driver.js"
import { startRunSession } from "./driver.js"
import { makeLatencyRecorder } from "./latency.js"
import type { OpenLoopResult } from "./results.js"
import { makeRng } from "./rng.js"
import type { CycleContext, RunStep } from "./workloads.js"

/** Seed of the arrival times: every target sees the same schedule for the same rate. */
const arrivalSeed = 0x5eed_a771
/** How often the scheduler wakes when no reply does (Node's timer granularity is about 1 ms). */
const arrivalTickMs = 1
/** Taken entries the idle-lane queue keeps before it drops them. */
const idleLanesCompactAt = 1024

export interface RatePlan extends SessionPlan {
  /** Mean arrival rate of cycles. */
  readonly cyclesPerSecond: number
  /** Cycles in flight at most; an arrival past it is dropped. */
  readonly inFlightMax: number
}

/** One virtual worker: a cycle context, reused by one cycle at a time. */
interface Lane {
  readonly context: CycleContext
  /** The running cycle's place in the schedule, until its first request is recorded. */
  readonly timing: { intendedStartMs: number | undefined }
}

export const runAtRate: Runner<RatePlan, OpenLoopResult> = async (target, plan, onTick) => {
  const session = startRunSession(target, plan)
  const cycleLatency = makeLatencyRecorder()
  const startLag = makeLatencyRecorder()
  const arrivals = makeRng(arrivalSeed)
  const meanGapMs = 1000 / plan.cyclesPerSecond
  // Exponential gaps make a Poisson process; 1 - next() is in (0, 1], so the logarithm is finite.
  const nextGapMs = () => -Math.log(1 - arrivals.next()) * meanGapMs
  const counts = { offered: 0, dropped: 0, droppedInWarmup: 0 }
  let inFlight = 0
  let inFlightPeak = 0
  let arriving = true
  let failure: unknown = undefined
  let onIdle: (() => void) | undefined

  // Idle lanes are reused oldest first, so a hot-workload lane's carried hold is settled soon.
  const idleLanes: Array<Lane> = []
  let idleHead = 0
  let lanesMade = 0
  const makeLane = (): Lane => {
    const timing: Lane["timing"] = { intendedStartMs: undefined }
    const step: RunStep = async (name, send) => {
      const startedMs = timing.intendedStartMs ?? performance.now()
      const outcome = await session.recordStep(name, send, startedMs)
      if (outcome !== "none") timing.intendedStartMs = undefined
      return outcome
    }
    const context = session.contextFor(lanesMade, step)
    lanesMade += 1
    return { context, timing }
  }
  const takeLane = (): Lane => {
    const lane = idleLanes[idleHead]
    if (lane === undefined) return makeLane()
    idleHead += 1
    // Forget the taken entries now and then, so the queue does not grow with every cycle run.
    if (idleHead >= idleLanesCompactAt) {
      idleLanes.splice(0, idleHead)
      idleHead = 0
    }
    return lane
  }

  const startCycle = (intendedStartMs: number) => {
    const lane = takeLane()
    lane.timing.intendedStartMs = intendedStartMs
    const startedMs = performance.now()
    inFlight += 1
    inFlightPeak = Math.max(inFlightPeak, inFlight)
    const finished = () => {
      inFlight -= 1
      if (session.isMeasuring()) {
        cycleLatency.recordMs(performance.now() - intendedStartMs)
        startLag.recordMs(startedMs - intendedStartMs)
      }
      idleLanes.push(lane)
      if (inFlight === 0) onIdle?.()
      pump()
    }
    session.runCycle(lane.context).then(finished, (error: unknown) => {
      failure ??= error
      finished()
    })
  }

  let nextArrivalMs = performance.now() + nextGapMs()
  /** Starts every arrival that is due: called by the timer and after every cycle. */
  const pump = () => {
    const now = performance.now()
    while (arriving && nextArrivalMs <= now) {
      const intendedStartMs = nextArrivalMs
      nextArrivalMs += nextGapMs()
      const measuring = session.isMeasuring()
      if (measuring) counts.offered += 1
      if (inFlight < plan.inFlightMax) startCycle(intendedStartMs)
      else if (measuring) counts.dropped += 1
      else counts.droppedInWarmup += 1
    }
  }
  const timer = setInterval(pump, arrivalTickMs)
  const window = await session.runWindows(onTick)
  arriving = false
  clearInterval(timer)
  const settled = inFlight === 0 ? Promise.resolve() : new Promise<void>((resolve) => (onIdle = resolve))
  const drainedCleanly = await session.drain(settled)
  if (failure !== undefined) throw failure
  return {
    ...session.result({ ...window, concurrency: inFlightPeak, drainedCleanly }),
    offeredPerSecond: plan.cyclesPerSecond,
    offered: counts.offered,
    dropped: counts.dropped,
    droppedInWarmup: counts.droppedInWarmup,
    inFlightMax: plan.inFlightMax,
    cycleLatency: cycleLatency.summary(),
    startLag: startLag.summary()
  }
}
