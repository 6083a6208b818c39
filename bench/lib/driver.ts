/**
 * Runs one workload against one target at one concurrency: `concurrency` workers each run cycles back
 * to back (a closed loop: a worker sends its next request when the previous reply arrives). Counts
 * and latencies are kept for steps that complete inside the measured window (after the warm-up);
 * the tally checks every grant of the whole run. At the end the workers finish their cycle and stop.
 * The session (counts, tally, windows, result) is shared with the open loop of openLoop.ts.
 */
import { setTimeout as sleep } from "node:timers/promises"
import { performance } from "node:perf_hooks"
import type { StepOutcome, Target } from "../targets/Target.js"
import type { CpuShares, ServerProcesses } from "./cpu.js"
import { startCpuMeter } from "./cpu.js"
import { makeLatencyRecorder } from "./latency.js"
import type { RunResult } from "./results.js"
import { makeRng } from "./rng.js"
import { makeTally } from "./tally.js"
import { makeTimelineRecorder } from "./timeline.js"
import type { WalMeter } from "./wal.js"
import type { CycleContext, RunStep, StepName, Workload } from "./workloads.js"

/** What every run needs, closed or open loop. */
export interface SessionPlan {
  readonly workload: Workload
  readonly warmupMs: number
  readonly measureMs: number
  /** Unique per run: hold ids and hot users carry it, so no run sees another's state. */
  readonly runTag: string
  /** How long the cycles in flight may finish after the window before the run is reported stuck. */
  readonly drainMsMax: number
  /** The server process started for this run (coordinator, echo), whose CPU is reported apart. */
  readonly server?: ServerProcesses
  /** Measures the WAL the window wrote (absent: not measured). */
  readonly wal?: WalMeter
}

export interface RunPlan extends SessionPlan {
  readonly concurrency: number
}

/**
 * What a closed-loop and an open-loop run share: counts, tally, latencies of the measured window, the
 * cycle contexts, the warm-up and measured windows with their CPU meter, and the result.
 */
export interface RunSession {
  readonly isMeasuring: () => boolean
  /** Runs one cycle of the run's workload; counts it when it ends in the window and the workload counts it. */
  readonly runCycle: (context: CycleContext) => Promise<void>
  /** Runs one step and, inside the window, records its latency from `startedMs` and its outcome. */
  readonly recordStep: (
    name: StepName,
    send: () => Promise<StepOutcome>,
    startedMs: number
  ) => Promise<StepOutcome>
  /** A context for worker (or lane) `index`: its own seeded rng and carried hold. */
  readonly contextFor: (index: number, step: RunStep) => CycleContext
  /** Waits out the warm-up, then measures for `measureMs`: the window's length and CPU shares. */
  readonly runWindows: (onTick: (fraction: number) => void) => Promise<MeasuredWindow>
  /** Waits for `settled` (the cycles in flight finishing) at most drainMsMax: true when it settled. */
  readonly drain: (settled: Promise<unknown>) => Promise<boolean>
  readonly result: (
    run: MeasuredWindow & { readonly concurrency: number; readonly drainedCleanly: boolean }
  ) => RunResult
}

/** What the measured window saw besides the requests. */
export interface MeasuredWindow {
  readonly measuredMs: number
  readonly cpu: CpuShares
  /** Undefined when the plan measured none (or reading the position failed). */
  readonly walBytes: number | undefined
}

const noSteps = (): Record<StepName, number> => ({
  reserve: 0,
  consume: 0,
  commit: 0,
  release: 0,
  acquire_slot: 0,
  release_slot: 0
})

export const startRunSession = (target: Target, plan: SessionPlan): RunSession => {
  const latency = makeLatencyRecorder()
  const timeline = makeTimelineRecorder()
  const tally = makeTally()
  const counts = { cycles: 0, requests: 0, granted: 0, refused: 0, errors: 0 }
  const applied = noSteps()
  let measuring = false
  let idSequence = 0
  const cycle = plan.workload.startRun(plan.runTag)
  const before = target.counters()

  const recordStep = async (
    name: StepName,
    send: () => Promise<StepOutcome>,
    startedMs: number
  ): Promise<StepOutcome> => {
    let outcome: StepOutcome
    try {
      outcome = await send()
    } catch {
      outcome = "error"
    }
    if (outcome === "none" || !measuring) return outcome
    const latencyMs = performance.now() - startedMs
    latency.recordMs(latencyMs)
    timeline.recordMs(latencyMs)
    counts.requests += 1
    if (outcome === "error") counts.errors += 1
    else if (outcome === "refused") counts.refused += 1
    else {
      applied[name] += 1
      if (name === "reserve" || name === "acquire_slot") counts.granted += 1
    }
    return outcome
  }

  const contextFor = (index: number, step: RunStep): CycleContext => ({
    target,
    rng: makeRng(0x9e3779b9 ^ (index * 7919)),
    tally,
    step,
    worker: { heldHold: undefined },
    nextId: () => `${plan.runTag}.${(idSequence += 1)}`
  })

  const runWindows = async (onTick: (fraction: number) => void) => {
    const started = performance.now()
    const total = plan.warmupMs + plan.measureMs
    const ticker = setInterval(() => onTick(Math.min(1, (performance.now() - started) / total)), 100)
    await sleep(plan.warmupMs)
    // Read before the window opens: the round trip is not in it. A failed read loses the WAL figure only.
    const walStop = await plan.wal?.start().catch(() => undefined)
    measuring = true
    const cpuMeter = startCpuMeter(plan.server)
    const measureStarted = performance.now()
    await sleep(plan.measureMs)
    measuring = false
    const cpu = cpuMeter.stop()
    const measuredMs = performance.now() - measureStarted
    const walBytes = await walStop?.().catch(() => undefined)
    clearInterval(ticker)
    return { measuredMs, cpu, walBytes }
  }

  return {
    isMeasuring: () => measuring,
    runCycle: async (context) => {
      if ((await cycle(context)) && measuring) counts.cycles += 1
    },
    recordStep,
    contextFor,
    runWindows,
    drain: (settled) => Promise.race([settled.then(() => true), sleep(plan.drainMsMax).then(() => false)]),
    result: ({ concurrency, measuredMs, cpu, walBytes, drainedCleanly }) => {
      const after = target.counters()
      const messages = after.messages - before.messages
      timeline.write({
        target: target.key,
        workload: plan.workload.key,
        concurrency,
        runTag: plan.runTag,
        // An open loop's plan (openLoop.ts) carries its rate.
        offeredPerSecond: "cyclesPerSecond" in plan ? plan.cyclesPerSecond : undefined
      })
      return {
        target: target.key,
        workload: plan.workload.key,
        concurrency,
        measuredMs,
        cycles: counts.cycles,
        requests: counts.requests,
        applied: { ...applied },
        granted: counts.granted,
        refused: counts.refused,
        errors: counts.errors,
        overGrants: tally.overGrants(),
        latency: latency.summary(),
        meanBatch: messages > 0 ? (after.requests - before.requests) / messages : 1,
        drainedCleanly,
        cpu,
        walBytes,
        firstError: target.takeError()
      }
    }
  }
}

/** A run of one workload against one target; `onTick` hears how far along it is (0 to 1). */
export type Runner<Plan extends SessionPlan, Result extends RunResult> = (
  target: Target,
  plan: Plan,
  onTick: (fraction: number) => void
) => Promise<Result>

/** The closed loop: `concurrency` workers, each sending its next cycle when the previous one ends. */
export const runWorkload: Runner<RunPlan, RunResult> = async (target, plan, onTick) => {
  const session = startRunSession(target, plan)
  let stopping = false
  // A closed loop's request starts when it is sent: the worker was waiting for nothing else.
  const step: RunStep = (name, send) => session.recordStep(name, send, performance.now())
  const worker = async (index: number): Promise<void> => {
    const context = session.contextFor(index, step)
    while (!stopping) await session.runCycle(context)
  }
  const workers = Array.from({ length: plan.concurrency }, (_, index) => worker(index))
  const window = await session.runWindows(onTick)
  stopping = true
  const drainedCleanly = await session.drain(Promise.all(workers))
  return session.result({ ...window, concurrency: plan.concurrency, drainedCleanly })
}
