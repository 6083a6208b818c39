/**
 * Latency reference points at the coordinator's half-peak rates: each coordinator open-loop run is
 * repeated, at the same offered rate, with the same workload and the same shape of sending (one
 * command per message, or commands coalesced per microtask by the bench's coalescer, which unlike the
 * SDK does not wait for a partition's message in flight), against two far sides that decide nothing:
 *
 * - the NATS echo (echoServer.ts): request/reply and the bench's own work, nothing else;
 * - the durable echo (durableEchoServer.ts): the same, replying only after one row per command is
 *   committed in Postgres, with group commit as the coordinator does.
 *
 * Their p99 at that rate is what NATS, Postgres's commits and this bench cost on this machine at that
 * load. They are references, not strict bounds: an echo answers every step `ok`, so in the hot and mix
 * workloads its cycles carry every command, where the coordinator's end early on a refusal.
 */
import type { RatePlan } from "./lib/openLoop.js"
import { runAtRate } from "./lib/openLoop.js"
import type { SessionPlan } from "./lib/driver.js"
import type { Progress } from "./lib/progress.js"
import type { FloorKind, FloorRun, OpenLoopResult } from "./lib/results.js"
import type { Workload } from "./lib/workloads.js"
import { startEchoProcess } from "./targets/echoProcess.js"
import { makeNatsTarget } from "./targets/natsTarget.js"
import type { Target } from "./targets/Target.js"

export interface FloorsPlan {
  readonly root: string
  /** The running NATS echo's subject prefix and process. */
  readonly echo: { readonly prefix: string; readonly pid: number }
  /** Where the durable echo writes (the bench's baseline database). */
  readonly databaseUrl: string
  readonly namespace: string
  readonly partitions: number
  readonly inFlightMax: number
  /** The coordinator's open-loop runs to repeat. */
  readonly coordinatorRuns: ReadonlyArray<OpenLoopResult>
  readonly workloads: ReadonlyArray<Workload>
  readonly sessionPlan: (workload: Workload, server: SessionPlan["server"]) => SessionPlan
  readonly progress: Progress
  /** Registers a stop for a process this phase starts, so an interrupted bench stops it too. */
  readonly onStarted: (stop: () => Promise<void>) => void
}

const floorLabels: Readonly<Record<FloorKind, string>> = {
  echo: "NATS echo",
  "durable-echo": "durable echo"
}

/** The SDK coalesces per microtask; the bench's coalescer does the same for the floors. */
const sendingModeOf = (coordinatorTarget: string): "message" | "coalesce" =>
  coordinatorTarget === "coord-sdk" ? "coalesce" : "message"

export const measureFloors = async (plan: FloorsPlan): Promise<ReadonlyArray<FloorRun>> => {
  const runs: Array<FloorRun> = []
  if (plan.coordinatorRuns.length === 0) return runs
  const durablePrefix = `bench_durable_echo_${plan.namespace}`
  const durable = await startEchoProcess(plan.root, "durableEchoServer.ts", [durablePrefix, plan.databaseUrl])
  plan.onStarted(durable.stop)
  const targets = new Map<string, Target>()
  try {
    const servers: Record<FloorKind, { readonly prefix: string; readonly pid: number }> = {
      echo: plan.echo,
      "durable-echo": { prefix: durablePrefix, pid: durable.pid }
    }
    const targetFor = async (floor: FloorKind, mode: "message" | "coalesce"): Promise<Target> => {
      const key = `${floor}-${mode}`
      const known = targets.get(key)
      if (known !== undefined) return known
      const target = await makeNatsTarget({
        key,
        label: `${floorLabels[floor]}, ${mode === "message" ? "one command per message" : "batched"}`,
        notes: [],
        prefix: servers[floor].prefix,
        partitions: plan.partitions,
        mode,
        echo: true
      })
      targets.set(key, target)
      return target
    }
    for (const coordinatorRun of plan.coordinatorRuns) {
      const workload = plan.workloads.find((candidate) => candidate.key === coordinatorRun.workload)
      if (workload === undefined) continue
      const mode = sendingModeOf(coordinatorRun.target)
      for (const floor of ["echo", "durable-echo"] as const) {
        const target = await targetFor(floor, mode)
        const ratePlan: RatePlan = {
          ...plan.sessionPlan(workload, { pids: [servers[floor].pid], label: floor }),
          cyclesPerSecond: coordinatorRun.offeredPerSecond,
          inFlightMax: plan.inFlightMax
        }
        const label = `floor ${floorLabels[floor]} (${mode}) ${workload.key} at ${Math.round(coordinatorRun.offeredPerSecond)}/s`
        const run = await runAtRate(target, ratePlan, (fraction) => plan.progress.update(label, fraction))
        runs.push({ floor, coordinatorTarget: coordinatorRun.target, run })
        plan.progress.advance(
          `${label}: p99 ${run.latency.p99Ms.toFixed(1)} ms, start lag p99 ${run.startLag.p99Ms.toFixed(1)} ms, errors ${run.errors}`
        )
      }
    }
  } finally {
    await Promise.allSettled([...targets.values()].map((target) => target.close()))
    await durable.stop()
  }
  return runs
}
