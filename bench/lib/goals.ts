/**
 * The issue's goals, checked against one run's own numbers: every required value, best value and
 * verdict below is computed from the runs of the report, and every goal is set next to the ceilings
 * measured in the same run (NATS echo, bare Postgres insert) that bound any design paying that hop or
 * that write.
 */
import type { InsertCeiling } from "../ceilings.js"
import type { RunResult } from "./driver.js"
import { cyclesPerSecond } from "./driver.js"
import { formatMs, formatRate, perSecond } from "./format.js"
import type { OpenLoopResult } from "./openLoop.js"
import { floorHeld, floorsOf } from "./floorsReport.js"
import type { FloorRun, HalfPeakRun, Report } from "./report.js"
import type { StepName, WorkloadKey } from "./workloads.js"

/** The issue's latency goal: p99 at most this at half of peak throughput. */
export const p99GoalMs = 5

/** A throughput goal: the coordinator's best cycles/s at least `factor` times the baseline's best. */
interface ThroughputGoal {
  readonly workload: WorkloadKey
  readonly baseline: string
  readonly factor: number
}

/** The issue's throughput goals; "2× the Redis design" names no workload, so it is checked on each. */
const throughputGoals: ReadonlyArray<ThroughputGoal> = [
  { workload: "uniform", baseline: "seed004", factor: 20 },
  { workload: "hot", baseline: "seed004", factor: 50 },
  { workload: "uniform", baseline: "seed003", factor: 2 },
  { workload: "hot", baseline: "seed003", factor: 2 },
  { workload: "mix", baseline: "seed003", factor: 2 }
]

/**
 * Rows a decision answered "ok" makes the coordinator write durably (src/domain/holds.ts and slots,
 * written by src/store/postgres/writeEvents.ts): `holdAndLedger` rows are its own, `usage` is the
 * usage-total upsert, which a group writes once per user.
 */
const durableRowsPerStep: Readonly<Record<StepName, { holdAndLedger: number; usage: number }>> = {
  reserve: { holdAndLedger: 1, usage: 0 },
  consume: { holdAndLedger: 2, usage: 1 },
  commit: { holdAndLedger: 2, usage: 1 },
  release: { holdAndLedger: 1, usage: 0 },
  acquire_slot: { holdAndLedger: 1, usage: 0 },
  release_slot: { holdAndLedger: 1, usage: 0 }
}

/** Workloads whose decisions all fall on one user: their usage total is one row per group, not per decision. */
const oneUserWorkloads: ReadonlySet<WorkloadKey> = new Set(["hot"])

export const rowsPerCycleAssumption = `Rows a cycle writes durably are counted from the run's own answered requests (src/domain/holds.ts; one statement per table in src/store/postgres/writeEvents.ts): a granted reserve inserts its hold (1 row); a consume or a commit updates the hold, appends a ledger row and upserts the usage total (3 rows); a release updates the hold (1); acquire_slot and release_slot write the slot row (1 each); a refusal writes nothing. Where every decision is on one user (${[...oneUserWorkloads].join(", ")}), the usage total is one row per group commit and is not counted per cycle. Reserve then commit is 4 rows.`

/** Rows per cycle of a run, from its answered requests; undefined when it completed no cycle. */
export const rowsPerCycle = (run: RunResult): number | undefined => {
  if (run.cycles === 0) return undefined
  const countsUsage = !oneUserWorkloads.has(run.workload)
  let rows = 0
  for (const [step, rowsOfStep] of Object.entries(durableRowsPerStep) as Array<
    [StepName, { holdAndLedger: number; usage: number }]
  >) {
    rows += run.applied[step] * (rowsOfStep.holdAndLedger + (countsUsage ? rowsOfStep.usage : 0))
  }
  return rows / run.cycles
}

/** The run with the most cycles/s among `runs`; undefined when there is none. */
export const bestRun = <Run extends RunResult>(runs: ReadonlyArray<Run>): Run | undefined =>
  runs.reduce<Run | undefined>(
    (best, run) => (best === undefined || cyclesPerSecond(run) > cyclesPerSecond(best) ? run : best),
    undefined
  )

/** Whether an open-loop run meets the latency goal, and why, in words. */
export const p99Verdict = (run: OpenLoopResult): { readonly met: boolean; readonly text: string } => {
  const reasons: Array<string> = []
  const p99Met = run.latency.count > 0 && run.latency.p99Ms <= p99GoalMs
  reasons.push(
    run.latency.count === 0
      ? "no request completed in the window"
      : `p99 ${formatMs(run.latency.p99Ms)} ms ${p99Met ? "≤" : ">"} ${p99GoalMs} ms`
  )
  if (run.dropped > 0)
    reasons.push(
      `${run.dropped} of ${run.offered} arrivals dropped at the cap of ${run.inFlightMax} cycles in flight (the target did not keep up, and the dropped ones have no latency)`
    )
  if (run.errors > 0) reasons.push(`${run.errors} requests without a decision`)
  if (run.overGrants > 0) reasons.push(`${run.overGrants} over-grants`)
  const met = p99Met && run.dropped === 0 && run.errors === 0 && run.overGrants === 0
  const clean = run.dropped === 0 && run.errors === 0 ? ", nothing dropped, no errors" : ""
  const lag = `; the bench's own start lag, inside the latencies: p99 ${formatMs(run.startLag.p99Ms)} ms`
  return { met, text: `${reasons.join("; ")}${clean}${lag}: **${met ? "met" : "not met"}**` }
}

const echoKeys = { batched: "echo-coalesce", perMessage: "echo-message" } as const

/** A ceiling in the workload's cycles/s, and where it was measured. */
interface Ceiling {
  readonly cyclesPerSecond: number
  readonly where: string
  readonly batch?: number
}

const requestRate = (run: RunResult) => perSecond(run.requests, run.measuredMs)

/** The NATS echo (uniform cycles) as cycles/s of a workload whose cycles send `requestsPerCycle`. */
const echoCeiling = (run: RunResult | undefined, requestsPerCycle: number): Ceiling | undefined =>
  run === undefined || requestsPerCycle <= 0
    ? undefined
    : {
        cyclesPerSecond: requestRate(run) / requestsPerCycle,
        where: `${run.concurrency} in flight`,
        batch: run.meanBatch
      }

/**
 * Below this many rows per cycle a cycle's durable writes are per group commit, not per cycle (the hot
 * user, where nearly every reserve is refused), and a rows-per-cycle ceiling says nothing.
 */
const rowsPerCycleMeaningfulMin = 0.05

/** A Node.js process at this share of one core (%) or more is saturated: its one thread is the bound. */
const saturatedCorePercent = 85

const insertCeiling = (insert: InsertCeiling | undefined, rows: number | undefined): Ceiling | undefined =>
  insert === undefined || rows === undefined || rows < rowsPerCycleMeaningfulMin
    ? undefined
    : {
        cyclesPerSecond: insert.rowsPerSecond / rows,
        where: `${formatRate(insert.rowsPerSecond)} rows/s at ${insert.batchRows} rows per commit ÷ ${formatRows(rows)} rows per cycle`
      }

/** Rows per cycle: two decimals below one (the hot user's refusals write nothing). */
const formatRows = (rows: number) => rows.toFixed(rows < 1 ? 2 : 1)

const highest = (ceilings: ReadonlyArray<Ceiling | undefined>): Ceiling | undefined =>
  ceilings.reduce<Ceiling | undefined>(
    (top, ceiling) =>
      ceiling !== undefined && (top === undefined || ceiling.cyclesPerSecond > top.cyclesPerSecond)
        ? ceiling
        : top,
    undefined
  )

const cell = (ceiling: Ceiling | undefined) =>
  ceiling === undefined ? "n/a" : formatRate(ceiling.cyclesPerSecond)

/** Sentences saying which ceilings of the run the required value is above (or that it is below all). */
const ceilingSentences = (
  report: Report,
  required: number,
  best: RunResult,
  requestsPerCycle: number,
  rows: number | undefined
): Array<string> => {
  const echoOf = (key: string) => report.echo.filter((run) => run.target === key)
  const perMessage = highest(echoOf(echoKeys.perMessage).map((run) => echoCeiling(run, requestsPerCycle)))
  const batched = highest(echoOf(echoKeys.batched).map((run) => echoCeiling(run, requestsPerCycle)))
  const insert = highest(report.inserts.map((candidate) => insertCeiling(candidate, rows)))
  const sentences: Array<string> = []
  if (perMessage !== undefined && required > perMessage.cyclesPerSecond) {
    sentences.push(
      `The required ${formatRate(required)} cycles/s is above the highest per-message NATS echo ceiling of this run (${formatRate(perMessage.cyclesPerSecond)} cycles/s at ${perMessage.where}): no design that sends one NATS request per command can reach it on this machine.`
    )
  }
  if (batched !== undefined && required > batched.cyclesPerSecond) {
    const echoBatch = batched.batch ?? 1
    sentences.push(
      best.meanBatch > echoBatch
        ? `It is above the highest batched NATS echo ceiling too (${formatRate(batched.cyclesPerSecond)} cycles/s at ${batched.where}, ${echoBatch.toFixed(1)} requests per message), but that ceiling does not bound this workload: the coordinator's batches here were larger (${best.meanBatch.toFixed(1)} per message).`
        : `It is above the highest batched NATS echo ceiling of this run (${formatRate(batched.cyclesPerSecond)} cycles/s at ${batched.where}, ${echoBatch.toFixed(1)} requests per message): no design that pays the NATS hop with batches of that size can reach it on this machine.`
    )
  }
  if (insert !== undefined && required > insert.cyclesPerSecond) {
    sentences.push(
      `It is above the Postgres bare-insert ceiling of this run (${insert.where} = ${formatRate(insert.cyclesPerSecond)} cycles/s, one writer): no design that writes those rows durably, one commit at a time, can reach it on this machine.`
    )
  }
  sentences.push(...saturationSentences(best, "the coordinator's best run"))
  if (sentences.length === 0) {
    sentences.push(
      `The required ${formatRate(required)} cycles/s is below every ceiling measured in this run (highest: NATS echo per message ${cell(perMessage)}, batched ${cell(batched)}, Postgres bare insert ${cell(insert)} cycles/s).`
    )
  }
  return sentences
}

/** Which single-threaded process of a run was saturated: the bench's load generator, the coordinator. */
const saturationSentences = (run: RunResult, what: string): Array<string> => {
  const sentences: Array<string> = []
  if (run.cpu.bench >= saturatedCorePercent) {
    sentences.push(
      `In ${what} (${run.target} at ${run.concurrency} in flight) the bench's own load generator, one Node.js thread, used ${Math.round(run.cpu.bench)}% of a core: it bounds that number as much as the system under test does.`
    )
  }
  if (run.cpu.serverLabel === "coord" && run.cpu.server >= saturatedCorePercent) {
    sentences.push(
      `In ${what} (${run.target} at ${run.concurrency} in flight) the coordinator's one Node.js thread used ${Math.round(run.cpu.server)}% of a core.`
    )
  }
  return sentences
}

const throughputLines = (report: Report, labelOf: (key: string) => string): Array<string> => {
  const lines: Array<string> = []
  const workloadsRun = new Set(report.runs.map((run) => run.workload))
  const goals = throughputGoals.filter((goal) => workloadsRun.has(goal.workload))
  if (goals.length === 0) return ["No workload of the throughput goals ran."]
  lines.push(
    `Peak against peak: a target's value is the most cycles/s it reached at any closed-loop concurrency of this run (${report.levels.join(", ")}); the ceilings are taken at the concurrency of the coordinator's best and converted to the workload's cycles with its own requests per cycle (NATS) and rows per cycle (Postgres; see below).`
  )
  lines.push("")
  lines.push(
    "| goal | required cycles/s | best coordinator cycles/s | ratio reached | met | NATS echo at that concurrency, batched / per message (cycles/s) | Postgres bare insert at that concurrency (cycles/s) |"
  )
  lines.push(`|${" --- |".repeat(7)}`)
  const notes: Array<string> = []
  for (const goal of goals) {
    const title = `${goal.workload}: ≥ ${goal.factor}× ${goal.baseline}`
    const baseline = bestRun(
      report.runs.filter((run) => run.target === goal.baseline && run.workload === goal.workload)
    )
    const best = bestRun(
      report.runs.filter(
        (run) => report.coordinatorKeys.includes(run.target) && run.workload === goal.workload
      )
    )
    if (baseline === undefined || best === undefined) {
      const missing = baseline === undefined ? labelOf(goal.baseline) : "the coordinator"
      lines.push(`| ${title} | n/a | n/a | n/a | not measured (${missing} did not run it) | n/a | n/a |`)
      continue
    }
    const required = goal.factor * cyclesPerSecond(baseline)
    const reached = cyclesPerSecond(best)
    const met = reached >= required
    const requestsPerCycle = best.cycles > 0 ? best.requests / best.cycles : 0
    const rows = rowsPerCycle(best)
    const echoAt = (key: string) =>
      echoCeiling(
        report.echo.find((run) => run.target === key && run.concurrency === best.concurrency),
        requestsPerCycle
      )
    const insertAt = insertCeiling(
      report.inserts.find((insert) => insert.batchRows === best.concurrency),
      rows
    )
    const ceilingCells = report.ceilingsMeasured
      ? [
          `${cell(echoAt(echoKeys.batched))} / ${cell(echoAt(echoKeys.perMessage))}`,
          `${cell(insertAt)}${rows === undefined ? "" : ` (${formatRows(rows)} rows/cycle)`}`
        ]
      : ["not measured", "not measured"]
    const baselineRate = cyclesPerSecond(baseline)
    lines.push(
      `| ${title} | ${formatRate(required)} (${goal.factor} × ${formatRate(baselineRate)} at ${baseline.concurrency}) | ${formatRate(reached)} (${best.target} at ${best.concurrency}${best.errors + best.overGrants > 0 ? `; ${best.errors} errors, ${best.overGrants} over-grants` : ""}) | ${baselineRate > 0 ? `${(reached / baselineRate).toFixed(2)}×` : "n/a"} | ${met ? "**met**" : "**not met**"} | ${ceilingCells.join(" | ")} |`
    )
    if (report.ceilingsMeasured) {
      const sentences = [
        ...ceilingSentences(report, required, best, requestsPerCycle, rows),
        ...saturationSentences(baseline, `the best run of ${labelOf(goal.baseline)}`)
      ]
      notes.push(`${title}: ${sentences.join(" ")}`)
    }
  }
  lines.push("")
  if (!report.ceilingsMeasured) {
    lines.push(
      "Ceilings were not measured in this run (`--no-ceilings`): nothing here says whether a required value is within reach of this machine."
    )
  } else {
    for (const note of notes) lines.push(`- ${note}`)
    lines.push("")
    lines.push(rowsPerCycleAssumption)
  }
  return lines
}

const latencyLines = (report: Report, labelOf: (key: string) => string): Array<string> => {
  const phase = report.halfPeak
  if (phase.skipped !== undefined)
    return [`p99 ≤ ${p99GoalMs} ms at half of peak: not measured (${phase.skipped}).`]
  const lines: Array<string> = []
  const workloads = [...new Set(phase.runs.map((entry) => entry.run.workload))]
  if (workloads.length === 0) lines.push("- Not measured: no target had an open-loop run.")
  for (const workload of workloads) {
    const coordinatorRuns = phase.runs.filter(
      (entry) => entry.run.workload === workload && report.coordinatorKeys.includes(entry.run.target)
    )
    if (coordinatorRuns.length === 0) {
      lines.push(`- ${workload}: no coordinator target had an open-loop run.`)
      continue
    }
    const verdicts = coordinatorRuns.map((entry) => ({ entry, verdict: p99Verdict(entry.run) }))
    const metBy = verdicts.filter(({ verdict }) => verdict.met).map(({ entry }) => labelOf(entry.run.target))
    const lowest = coordinatorRuns.reduce((best, entry) =>
      entry.run.latency.p99Ms < best.run.latency.p99Ms ? entry : best
    )
    // Every design of the run at half its own peak: whether the machine and the bench let any meet it.
    const anyDesign = phase.runs
      .filter((entry) => entry.run.workload === workload)
      .reduce((best, entry) => (entry.run.latency.p99Ms < best.run.latency.p99Ms ? entry : best))
    lines.push(
      `- ${workload}: required p99 ≤ ${p99GoalMs} ms at ${Math.round(phase.fraction * 100)}% of peak; lowest coordinator p99 ${formatMs(lowest.run.latency.p99Ms)} ms (${lowest.run.target} at ${formatRate(lowest.run.offeredPerSecond)} cycles/s offered): ${metBy.length > 0 ? `**met** by ${metBy.join(", ")}` : "**not met**"}. Lowest p99 of any design at half its own peak in this run: ${formatMs(anyDesign.run.latency.p99Ms)} ms (${labelOf(anyDesign.run.target)}, the bench's own start lag p99 ${formatMs(anyDesign.run.startLag.p99Ms)} ms inside it).`
    )
    lines.push(...floorLines(coordinatorRuns, phase.floors, labelOf))
  }
  if (!report.ceilingsMeasured) {
    lines.push(
      "- Latency floors not measured (`--no-ceilings`): nothing here says whether the goal is within reach of this machine."
    )
    return lines
  }
  // Floors: every durable decision through NATS waits for one round trip and one fsync'd commit.
  const lowestLevel = Math.min(...report.levels)
  const echoAtLowest = report.echo.filter((run) => run.concurrency === lowestLevel)
  const smallestInsert = report.inserts.reduce<InsertCeiling | undefined>(
    (smallest, insert) =>
      smallest === undefined || insert.batchRows < smallest.batchRows ? insert : smallest,
    undefined
  )
  const floors: Array<string> = echoAtLowest.map(
    (run) =>
      `NATS echo (${run.target === echoKeys.batched ? "batched" : "per message"}) at ${lowestLevel} in flight: p50 ${formatMs(run.latency.p50Ms)} ms, p99 ${formatMs(run.latency.p99Ms)} ms`
  )
  if (smallestInsert !== undefined) {
    floors.push(
      `Postgres bare-insert commit at ${smallestInsert.batchRows} rows: p50 ${formatMs(smallestInsert.latency.p50Ms)} ms, p99 ${formatMs(smallestInsert.latency.p99Ms)} ms`
    )
  }
  lines.push(
    `- Floors measured in this run (a durable decision through NATS pays one round trip and waits for one fsync'd commit): ${floors.join("; ")}.`
  )
  const abovePerHalf = [
    ...echoAtLowest
      .filter((run) => run.latency.p50Ms > p99GoalMs)
      .map((run) => `the NATS echo (${run.target})`),
    ...(smallestInsert !== undefined && smallestInsert.latency.p50Ms > p99GoalMs
      ? ["the bare Postgres commit"]
      : [])
  ]
  if (abovePerHalf.length > 0) {
    lines.push(
      `- Half of the round trips of ${abovePerHalf.join(" and ")} alone took more than ${p99GoalMs} ms here: no design that pays that hop or that commit can have a p99 of ${p99GoalMs} ms on this machine, at this load.`
    )
  }
  return lines
}

/** Per coordinator run of one workload: its floors' p99 at the same rate, and what they show. */
const floorLines = (
  coordinatorRuns: ReadonlyArray<HalfPeakRun>,
  floors: ReadonlyArray<FloorRun>,
  labelOf: (key: string) => string
): Array<string> => {
  const measured = coordinatorRuns
    .map(({ run }) => ({ run, ...floorsOf(floors, run) }))
    .filter((entry) => entry.durable !== undefined || entry.echo !== undefined)
  if (measured.length === 0) return []
  const p99Of = (run: OpenLoopResult | undefined) =>
    run === undefined
      ? "not measured"
      : floorHeld(run)
        ? `${formatMs(run.latency.p99Ms)} ms`
        : `${formatMs(run.latency.p99Ms)} ms but it did not keep up (errors, drops or no drain: see the table)`
  const lines = measured.map(
    ({ run, echo, durable }) =>
      `  - ${labelOf(run.target)} at ${formatRate(run.offeredPerSecond)} cycles/s: coordinator p99 ${formatMs(run.latency.p99Ms)} ms; at the same rate the NATS echo's p99 was ${p99Of(echo)} and the durable echo's ${p99Of(durable)}${floorHeld(durable) ? ` (the coordinator's is ${(run.latency.p99Ms / durable!.latency.p99Ms).toFixed(1)}× that)` : ""}.`
  )
  const workload = measured[0]!.run.workload
  // Only a like-for-like reference supports a verdict: uniform cycles take every step on both sides.
  if (workload !== "uniform") return lines
  if (measured.every(({ echo }) => floorHeld(echo) && echo!.latency.p99Ms > p99GoalMs)) {
    lines.push(
      `  - At every coordinator rate here even the NATS echo, which only answers, had a p99 over ${p99GoalMs} ms: at these rates the goal is below what NATS and this bench cost on this machine.`
    )
  } else if (measured.every(({ durable }) => floorHeld(durable) && durable!.latency.p99Ms > p99GoalMs)) {
    lines.push(
      `  - At every coordinator rate here the durable echo, which decides nothing and commits one row per command before it answers, had a p99 over ${p99GoalMs} ms: at these rates, on this machine and with this bench, NATS and Postgres's commits alone take more than the goal.`
    )
  }
  return lines
}

/** The "Goals against this run" section, as Markdown lines. */
export const renderGoals = (report: Report, labelOf: (key: string) => string): Array<string> => [
  "## Goals against this run",
  "",
  `The issue's goals, each computed from this run's numbers (nothing here is written by hand): ${throughputGoals.map((goal) => `${goal.workload} cycles/s at least ${goal.factor}× ${goal.baseline}'s`).join("; ")}; p99 at most ${p99GoalMs} ms at half of peak throughput.`,
  "",
  "### Throughput",
  "",
  ...throughputLines(report, labelOf),
  "",
  "### p99 at half of peak",
  "",
  ...latencyLines(report, labelOf),
  ""
]
