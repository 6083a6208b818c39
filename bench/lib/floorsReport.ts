/**
 * The floors' part of the report (bench/floors.ts): a table beside the coordinator's half-peak runs,
 * and, per coordinator run, whether even the floors met the p99 goal at its rate.
 */
import { formatCpu } from "./cpu.js"
import { formatMs, formatRate } from "./format.js"
import type { OpenLoopResult } from "./openLoop.js"
import type { FloorRun, HalfPeakRun } from "./report.js"

const latencyCell = (run: OpenLoopResult | undefined): string =>
  run === undefined
    ? "not measured"
    : `${formatMs(run.latency.p50Ms)} / ${formatMs(run.latency.p99Ms)} (${formatMs(run.startLag.p99Ms)})${run.errors > 0 ? `, ${run.errors} errors` : ""}`

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
    "Each coordinator run above repeated at the same offered rate, workload and way of sending (one command per message, or coalesced per microtask as the SDK does), against two far sides that do less than any coordinator can (bench/floors.ts): the *NATS echo* answers each request with its own bytes; the *durable echo* answers only after one hold-shaped row per command is committed (fsync'd) in Postgres, with group commit as the coordinator does (up to 4 commits in flight). The coordinator writes up to three rows per command, in up to three tables. Cells are p50 / p99 (start lag p99), in ms: the p99 a NATS service that answers once its answer is durable can have at that rate, with this bench, on this machine.",
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
