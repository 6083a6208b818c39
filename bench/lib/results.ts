/**
 * What a bench run produces, and the selectors every part of the report shares. Types and pure
 * functions only: the driver and the ceilings fill these in, goals.ts and report.ts read them, and
 * nothing here imports from either.
 */
import type { CpuShares } from "./cpu.js"
import type { LatencySummary } from "./latency.js"
import type { MachineInfo } from "./machine.js"
import type { StepName, Workload, WorkloadKey } from "./workloads.js"

/** One closed-loop run (lib/driver.ts) of one workload against one target. */
export interface RunResult {
  readonly target: string
  readonly workload: WorkloadKey
  /** Closed loop: the workers. Open loop: the most cycles that were in flight at once. */
  readonly concurrency: number
  readonly measuredMs: number
  /** Cycles completed in the window that the workload counts (hot-granted: granted ones only). */
  readonly cycles: number
  /** Requests completed in the window (steps that sent something). */
  readonly requests: number
  /** Requests answered "ok" in the window, per step: what a decision made the system write. */
  readonly applied: Readonly<Record<StepName, number>>
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
  /** WAL the whole Postgres server wrote during the window (wal.ts); undefined when not measured. */
  readonly walBytes: number | undefined
  readonly firstError: string | undefined
}

/** An open-loop run (lib/openLoop.ts): cycles offered at a rate. */
export interface OpenLoopResult extends RunResult {
  readonly offeredPerSecond: number
  /** Arrivals scheduled while the window measured. */
  readonly offered: number
  /** Of those, arrivals not started because `inFlightMax` cycles were in flight. */
  readonly dropped: number
  /** Arrivals dropped during the warm-up (not in `dropped`). */
  readonly droppedInWarmup: number
  readonly inFlightMax: number
  /** Whole cycles, from the intended start to the last reply, completed in the window. */
  readonly cycleLatency: LatencySummary
  /** How late cycles started against their schedule (the bench's own delay, inside the latencies). */
  readonly startLag: LatencySummary
}

/** The bare Postgres insert ceiling at one batch size (bench/ceilings.ts). */
export interface InsertCeiling {
  readonly batchRows: number
  readonly commits: number
  readonly rowsPerSecond: number
  readonly commitsPerSecond: number
  /** Latency of one commit (the statement). */
  readonly latency: LatencySummary
  readonly cpu: CpuShares
}

/** An open-loop run at a fraction of the peak a target reached in the closed loop. */
export interface HalfPeakRun {
  /** The closed-loop run of the same target and workload with the most cycles/s. */
  readonly peak: RunResult
  readonly run: OpenLoopResult
}

/** The far sides of the latency floors (bench/floors.ts). */
export type FloorKind = "echo" | "durable-echo"

/** A floor's open-loop run at the offered rate of one of the coordinator's half-peak runs. */
export interface FloorRun {
  readonly floor: FloorKind
  /** The coordinator target whose rate, workload and sending mode it repeats. */
  readonly coordinatorTarget: string
  readonly run: OpenLoopResult
}

export interface HalfPeakPhase {
  /** Why the phase did not run (e.g. `--no-half-peak`); absent when it ran. */
  readonly skipped?: string
  /** Offered rate ÷ closed-loop peak. */
  readonly fraction: number
  readonly inFlightMax: number
  readonly workloads: ReadonlyArray<WorkloadKey>
  readonly runs: ReadonlyArray<HalfPeakRun>
  /** Empty when the ceilings were not measured (`--no-ceilings`). */
  readonly floors: ReadonlyArray<FloorRun>
}

export interface TargetInfo {
  readonly key: string
  readonly label: string
  readonly durable: boolean
  readonly notes: ReadonlyArray<string>
  /** Set when the target did not run (failed to start). */
  readonly skipped?: string
}

/** The NATS echo ceiling's targets (same uniform workload, two ways of sending). */
export const echoKeys = { batched: "echo-coalesce", perMessage: "echo-message" } as const

export interface Report {
  readonly mode: "quick" | "full"
  readonly startedAt: Date
  readonly finishedAt: Date
  readonly machine: MachineInfo
  readonly services: ReadonlyArray<string>
  readonly loadAverage: ReadonlyArray<number>
  readonly levels: ReadonlyArray<number>
  readonly warmupMs: number
  readonly measureMs: number
  readonly workloads: ReadonlyArray<Workload>
  readonly targets: ReadonlyArray<TargetInfo>
  /** Keys of the coordinator's targets, compared against every other. */
  readonly coordinatorKeys: ReadonlyArray<string>
  readonly runs: ReadonlyArray<RunResult>
  readonly echo: ReadonlyArray<RunResult & { readonly label: string }>
  readonly inserts: ReadonlyArray<InsertCeiling>
  /** False with `--no-ceilings`. */
  readonly ceilingsMeasured: boolean
  readonly halfPeak: HalfPeakPhase
  readonly remarks: ReadonlyArray<string>
}

export const perSecond = (count: number, ms: number) => (ms > 0 ? (count * 1000) / ms : 0)

export const cyclesPerSecond = (run: RunResult): number => perSecond(run.cycles, run.measuredMs)

/**
 * CPU time of every Postgres process the bench counts (its databases' backends and the server's own
 * processes, cpu.ts) per cycle of the run, in µs; undefined when it completed no cycle.
 */
export const postgresMicrosPerCycle = (run: RunResult): number | undefined =>
  run.cycles > 0 ? ((run.cpu.postgres / 100) * run.measuredMs * 1_000) / run.cycles : undefined

/** WAL bytes per cycle of the run (cluster-wide, wal.ts); undefined when not measured or no cycle. */
export const walBytesPerCycle = (run: RunResult): number | undefined =>
  run.walBytes === undefined || run.cycles === 0 ? undefined : run.walBytes / run.cycles

export const findRun = <Run extends RunResult>(
  runs: ReadonlyArray<Run>,
  target: string,
  workload: string,
  concurrency: number
): Run | undefined =>
  runs.find((run) => run.target === target && run.workload === workload && run.concurrency === concurrency)

/** The run with the most cycles/s among `runs`; undefined when there is none. */
export const bestRun = <Run extends RunResult>(runs: ReadonlyArray<Run>): Run | undefined =>
  runs.reduce<Run | undefined>(
    (best, run) => (best === undefined || cyclesPerSecond(run) > cyclesPerSecond(best) ? run : best),
    undefined
  )

/** A floor run whose p99 can stand as a reference: it kept up with every arrival and answered all. */
export const floorHeld = (run: OpenLoopResult | undefined): run is OpenLoopResult =>
  run !== undefined && run.errors === 0 && run.dropped === 0 && run.drainedCleanly

/** The floor runs that repeat `coordinatorRun` (same target, workload and offered rate). */
export const floorsOf = (
  floors: ReadonlyArray<FloorRun>,
  coordinatorRun: OpenLoopResult
): { readonly echo: OpenLoopResult | undefined; readonly durable: OpenLoopResult | undefined } => {
  const of = (kind: FloorKind) =>
    floors.find(
      (floor) =>
        floor.floor === kind &&
        floor.coordinatorTarget === coordinatorRun.target &&
        floor.run.workload === coordinatorRun.workload &&
        floor.run.offeredPerSecond === coordinatorRun.offeredPerSecond
    )?.run
  return { echo: of("echo"), durable: of("durable-echo") }
}
