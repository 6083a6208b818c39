/**
 * Runs one workload against one target at one concurrency: `concurrency` workers each run cycles back
 * to back (a closed loop: a worker sends its next request when the previous reply arrives). Counts
 * and latencies are kept for steps that complete inside the measured window (after the warm-up);
 * the tally checks every grant of the whole run. At the end the workers finish their cycle and stop.
 */
import { performance } from "node:perf_hooks"
import type { StepOutcome, Target } from "../targets/Target.js"
import type { CpuShares } from "./cpu.js"
import { startCpuMeter } from "./cpu.js"
import type { LatencySummary } from "./latency.js"
import { makeLatencyRecorder } from "./latency.js"
import { makeRng } from "./rng.js"
import { makeTally } from "./tally.js"
import type { CycleContext, StepName, Workload } from "./workloads.js"
import { hotGrantsPerUser } from "./workloads.js"

export interface RunPlan {
  readonly workload: Workload
  readonly concurrency: number
  readonly warmupMs: number
  readonly measureMs: number
  /** Unique per run: hold ids and hot users carry it, so no run sees another's state. */
  readonly runTag: string
  /** How long the workers may take to finish their last cycle before the run is reported stuck. */
  readonly drainMsMax: number
  /** The server process started for this run (coordinator, echo), whose CPU is reported apart. */
  readonly server?: { readonly pid: number; readonly label: string }
}

export interface RunResult {
  readonly target: string
  readonly workload: Workload["key"]
  readonly concurrency: number
  readonly measuredMs: number
  readonly cycles: number
  /** Requests completed in the window (steps that sent something). */
  readonly requests: number
  readonly granted: number
  /** Reserves refused (insufficient quota) and slots refused (busy). */
  readonly refused: number
  readonly errors: number
  readonly overGrants: number
  readonly latency: LatencySummary
  /** Requests per message the target sent over the whole run (1 unless it batches). */
  readonly meanBatch: number
  readonly drainedCleanly: boolean
  /** CPU use during the measured window, by process group (see cpu.ts). */
  readonly cpu: CpuShares
  readonly firstError: string | undefined
}

export const runWorkload = async (
  target: Target,
  plan: RunPlan,
  onTick: (fraction: number) => void
): Promise<RunResult> => {
  const latency = makeLatencyRecorder()
  const tally = makeTally()
  const counts = { cycles: 0, requests: 0, granted: 0, refused: 0, errors: 0 }
  let measuring = false
  let stopping = false
  let idSequence = 0
  let hotGeneration = 0
  let hotGrants = 0
  const hotUser = () => `hot-${plan.runTag}-${hotGeneration}`
  const before = target.counters()

  const step = async (name: StepName, send: () => Promise<StepOutcome>): Promise<StepOutcome> => {
    const started = performance.now()
    let outcome: StepOutcome
    try {
      outcome = await send()
    } catch {
      outcome = "error"
    }
    if (outcome === "none" || !measuring) return outcome
    latency.recordMs(performance.now() - started)
    counts.requests += 1
    if (outcome === "error") counts.errors += 1
    else if (outcome === "refused") counts.refused += 1
    else if (name === "reserve" || name === "acquire_slot") counts.granted += 1
    return outcome
  }

  const worker = async (index: number): Promise<void> => {
    const context: CycleContext = {
      target,
      rng: makeRng(0x9e3779b9 ^ (index * 7919)),
      tally,
      step,
      worker: { heldHold: undefined },
      nextId: () => `${plan.runTag}.${(idSequence += 1)}`,
      hot: {
        user: hotUser,
        onGrant: () => {
          hotGrants += 1
          if (hotGrants >= hotGrantsPerUser) {
            hotGrants = 0
            hotGeneration += 1
          }
        }
      }
    }
    while (!stopping) {
      await plan.workload.cycle(context)
      if (measuring) counts.cycles += 1
    }
  }

  const started = performance.now()
  const workers = Array.from({ length: plan.concurrency }, (_, index) => worker(index))
  const total = plan.warmupMs + plan.measureMs
  const ticker = setInterval(() => onTick(Math.min(1, (performance.now() - started) / total)), 100)
  await sleep(plan.warmupMs)
  measuring = true
  const cpuMeter = startCpuMeter(plan.server)
  const measureStarted = performance.now()
  await sleep(plan.measureMs)
  measuring = false
  const cpu = cpuMeter.stop()
  const measuredMs = performance.now() - measureStarted
  stopping = true
  clearInterval(ticker)
  const drained = await Promise.race([
    Promise.all(workers).then(() => true),
    sleep(plan.drainMsMax).then(() => false)
  ])
  const after = target.counters()
  const messages = after.messages - before.messages
  return {
    target: target.key,
    workload: plan.workload.key,
    concurrency: plan.concurrency,
    measuredMs,
    cycles: counts.cycles,
    requests: counts.requests,
    granted: counts.granted,
    refused: counts.refused,
    errors: counts.errors,
    overGrants: tally.overGrants(),
    latency: latency.summary(),
    meanBatch: messages > 0 ? (after.requests - before.requests) / messages : 1,
    drainedCleanly: drained,
    cpu,
    firstError: target.takeError()
  }
}

export const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms))
