/**
 * The floors' part of the report (bench/floors.ts): a table beside the coordinator's half-peak runs,
 * and, per coordinator run, whether even the floors met the p99 goal at its rate.
 */
import { storeWritersMax } from "../../src/domain/limits.js"
import { formatCpu } from "./cpu.js"
import { formatMs, formatRate } from "./format.js"
import type { OpenLoopResult } from "./openLoop.js"
import type { FloorRun, HalfPeakRun } from "./report.js"

const latencyCell = (run: OpenLoopResult | undefined): string => {
  if (run === undefined) return "not measured"
  const trouble = [
    ...(run.errors > 0 ? [`${run.errors} errors`] : []),
    ...(run.dropped > 0 ? [`${run.dropped} of ${run.offered} dropped`] : []),
    ...(run.drainedCleanly ? [] : ["did not drain"])
  ]
  return `${formatMs(run.latency.p50Ms)} / ${formatMs(run.latency.p99Ms)} (${formatMs(run.startLag.p99Ms)})${trouble.length > 0 ? `, ${trouble.join(", ")}` : ""}`
}

/** A floor run whose p99 can stand as a reference: it kept up with every arrival and answered all. */
export const floorHeld = (run: OpenLoopResult | undefined): boolean =>
  run !== undefined && run.errors === 0 && run.dropped === 0 && run.drainedCleanly

/** The floor runs that repeat `coordinatorRun` (same target, workload and offered rate). */
export const floorsOf = (
  floors: ReadonlyArray<FloorRun>,
  coordinatorRun: OpenLoopResult
): { echo?: OpenLoopResult; durable?: OpenLoopResult } => {
  const matching = floors.filter(
    (floor) =>
      floor.coordinatorTarget === coordinatorRun.target &&
      floor.run.workload === coordinatorRun.workload &&
      floor.run.offeredPerSecond === coordinatorRun.offeredPerSecond
  )
  const echo = matching.find((floor) => floor.floor === "echo")?.run
  const durable = matching.find((floor) => floor.floor === "durable-echo")?.run
  return { ...(echo === undefined ? {} : { echo }), ...(durable === undefined ? {} : { durable }) }
}

export const renderFloorsTable = (
  coordinatorRuns: ReadonlyArray<HalfPeakRun>,
  floors: ReadonlyArray<FloorRun>,
  labelOf: (key: string) => string,
  cores: number
): Array<string> => {
  if (floors.length === 0) return []
  const lines: Array<string> = [
    "### Floors at the same offered rates",
    "",
    `Each coordinator run above repeated at the same offered rate and workload, sending the same way (one command per message, or commands coalesced per microtask by the bench's coalescer; unlike the SDK it does not wait for a partition's message in flight), against two far sides that decide nothing (bench/floors.ts): the *NATS echo* answers each request with its own bytes; the *durable echo* answers only after one hold-shaped row per command is committed (fsync'd) in Postgres, with group commit as the coordinator does (up to ${storeWritersMax} commits in flight). Cells are p50 / p99 (start lag p99), in ms: what NATS, Postgres's commits and this bench cost at that rate on this machine. They are references, not strict bounds: an echo answers every step \`ok\`, so in the hot and mix workloads its cycles carry every command (and the durable echo writes a row for each), where the coordinator's end early on a refusal; the coordinator writes up to three rows per command, in up to three tables, and none for a refusal.`,
    "",
    "| coordinator target | workload | offered cycles/s | coordinator | NATS echo | durable echo | durable echo: CPU % while measured |",
    `|${" --- |".repeat(7)}`
  ]
  for (const { run } of coordinatorRuns) {
    const { echo, durable } = floorsOf(floors, run)
    lines.push(
      `| ${labelOf(run.target)} | ${run.workload} | ${formatRate(run.offeredPerSecond)} | ${latencyCell(run)} | ${latencyCell(echo)} | ${latencyCell(durable)} | ${durable === undefined ? "" : formatCpu(durable.cpu, cores)} |`
    )
  }
  lines.push("")
  return lines
}
