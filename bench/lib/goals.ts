/**
 * The goals of issue 16, checked against one run's own numbers: every required value, measured value
 * and verdict below is computed from the report's runs, and each is set next to what bounds it in the
 * same run: the NATS echo and bare Postgres insert ceilings for throughput, the latency floors for p99.
 */
import { formatMs, formatRate } from "./format.js"
import type { InsertCeiling, OpenLoopResult, Report, RunResult } from "./results.js"
import {
  cyclesPerSecond,
  echoKeys,
  findRun,
  floorHeld,
  floorsOf,
  perSecond,
  postgresMicrosPerCycle,
  walBytesPerCycle
} from "./results.js"
import type { StepName, WorkloadKey } from "./workloads.js"

/** The coordinator's target the throughput goals are set for. */
const goalTarget = "coord-sdk"

/** The coordinator's cycles/s at least `factor` times the baseline's, both at `level` in flight. */
interface ThroughputGoal {
  readonly workload: WorkloadKey
  readonly level: number
  readonly baseline: string
  readonly factor: number
}

const throughputGoals: ReadonlyArray<ThroughputGoal> = [
  { workload: "uniform", level: 4096, baseline: "seed004", factor: 5 },
  { workload: "uniform", level: 256, baseline: "seed004", factor: 2.5 },
  { workload: "hot-granted", level: 4096, baseline: "seed004", factor: 50 },
  { workload: "hot-granted", level: 4096, baseline: "seed003", factor: 2 },
  { workload: "mix", level: 4096, baseline: "seed004", factor: 3 },
  // Issue 36's, at 1 024 in flight.
  { workload: "uniform", level: 1024, baseline: "seed004", factor: 5 },
  { workload: "hot-granted", level: 1024, baseline: "seed004", factor: 50 },
  { workload: "hot-granted", level: 1024, baseline: "seed003", factor: 1 }
]

/** p99 at half of peak at most this many times the durable echo's p99 at the same rate. */
const p99FloorFactor = 2

/** A Node.js process at this share of one core (%) or more is saturated: its one thread is the bound. */
const saturatedCorePercent = 85

/**
 * Rows a decision answered "ok" makes the coordinator write durably (src/domain/holds.ts and slots,
 * src/store/postgres/writeEvents.ts): `own` rows are the hold's and the ledger's, `usage` the
 * usage-total upsert, which a group writes once per user.
 */
const rowsPerStep: Readonly<Record<StepName, { own: number; usage: number }>> = {
  reserve: { own: 1, usage: 0 },
  consume: { own: 2, usage: 1 },
  commit: { own: 2, usage: 1 },
  release: { own: 1, usage: 0 },
  acquire_slot: { own: 1, usage: 0 },
  release_slot: { own: 1, usage: 0 }
}

/** Workloads whose decisions all fall on one user: their usage total is one row per group, not per cycle. */
const oneUserWorkloads: ReadonlySet<WorkloadKey> = new Set(["hot", "hot-granted"])

/** Rows per cycle of a run, from its answered requests; undefined when it completed no cycle. */
const rowsPerCycle = (run: RunResult): number | undefined => {
  if (run.cycles === 0) return undefined
  const usage = oneUserWorkloads.has(run.workload) ? 0 : 1
  const rows = (Object.keys(rowsPerStep) as Array<StepName>).reduce(
    (sum, step) => sum + run.applied[step] * (rowsPerStep[step].own + usage * rowsPerStep[step].usage),
    0
  )
  return rows / run.cycles
}

const rowsNote = `Rows a cycle writes durably are counted from the run's own answered requests: a granted reserve inserts its hold (1 row); a consume or a commit updates the hold, appends a ledger row and upserts the usage total (3); a release updates the hold (1); acquire_slot and release_slot write the slot row (1 each); a refusal writes nothing. Where every decision is on one user (${[...oneUserWorkloads].join(", ")}) the usage total is one row per group commit and is not counted per cycle.`

/** The ceilings of the run at one concurrency, in the workload's cycles/s. */
interface Ceilings {
  readonly batched: number | undefined
  readonly perMessage: number | undefined
  readonly batchedBatch: number | undefined
  readonly insert: number | undefined
  readonly rows: number | undefined
}

const ceilingsAt = (report: Report, level: number, run: RunResult): Ceilings => {
  const requestsPerCycle = run.cycles > 0 ? run.requests / run.cycles : 0
  const echo = (key: string) => {
    const found = report.echo.find((echoRun) => echoRun.target === key && echoRun.concurrency === level)
    return found === undefined || requestsPerCycle === 0
      ? undefined
      : { cycles: perSecond(found.requests, found.measuredMs) / requestsPerCycle, batch: found.meanBatch }
  }
  const rows = rowsPerCycle(run)
  const insert: InsertCeiling | undefined = report.inserts.find((ceiling) => ceiling.batchRows === level)
  return {
    batched: echo(echoKeys.batched)?.cycles,
    batchedBatch: echo(echoKeys.batched)?.batch,
    perMessage: echo(echoKeys.perMessage)?.cycles,
    // Under 0.05 rows per cycle the writes are per group commit, not per cycle: no ceiling to speak of.
    insert:
      insert === undefined || rows === undefined || rows < 0.05 ? undefined : insert.rowsPerSecond / rows,
    rows
  }
}

const rate = (value: number | undefined) => (value === undefined ? "n/a" : formatRate(value))

/** Which single-threaded process of a run was saturated: the bench's load generator, the coordinator. */
const saturation = (run: RunResult, what: string): Array<string> => [
  ...(run.cpu.bench >= saturatedCorePercent
    ? [
        `In ${what} the bench's own load generator, one Node.js thread, used ${Math.round(run.cpu.bench)}% of a core: it bounds that number as much as the system under test does.`
      ]
    : []),
  ...(run.cpu.serverLabel === "coord" && run.cpu.server >= saturatedCorePercent
    ? [`In ${what} the coordinator's one Node.js thread used ${Math.round(run.cpu.server)}% of a core.`]
    : [])
]

/** Sentences saying which ceilings the required value is above (or that it is below all of them). */
const boundSentences = (required: number, coordinator: RunResult, ceilings: Ceilings): Array<string> => {
  const sentences: Array<string> = []
  const level = coordinator.concurrency
  if (ceilings.perMessage !== undefined && required > ceilings.perMessage)
    sentences.push(
      `The required ${formatRate(required)} cycles/s is above the per-message NATS echo at ${level} in flight (${formatRate(ceilings.perMessage)}): no design sending one NATS request per command reaches it on this machine.`
    )
  if (ceilings.batched !== undefined && required > ceilings.batched)
    sentences.push(
      coordinator.meanBatch > (ceilings.batchedBatch ?? 1)
        ? `It is above the batched NATS echo (${formatRate(ceilings.batched)}, ${(ceilings.batchedBatch ?? 1).toFixed(1)} requests per message), which does not bound it: the coordinator's batches were larger (${coordinator.meanBatch.toFixed(1)}).`
        : `It is above the batched NATS echo (${formatRate(ceilings.batched)}, ${(ceilings.batchedBatch ?? 1).toFixed(1)} requests per message): no design paying the NATS hop with batches of that size reaches it here.`
    )
  if (ceilings.insert !== undefined && required > ceilings.insert)
    sentences.push(
      `It is above the Postgres bare insert at ${level} rows per commit ÷ ${ceilings.rows?.toFixed(1)} rows per cycle (${formatRate(ceilings.insert)}): no design writing those rows durably, one commit at a time, reaches it here.`
    )
  if (sentences.length === 0)
    sentences.push(
      `The required ${formatRate(required)} cycles/s is below every ceiling measured at ${level} in flight.`
    )
  return sentences
}

const throughputLines = (report: Report, labelOf: (key: string) => string): Array<string> => {
  const highest = Math.max(...report.levels)
  const lines = [
    `Each goal compares ${labelOf(goalTarget)} with the baseline at the same concurrency, cycles/s against cycles/s (hot-granted: granted and committed cycles only). Ceilings at that concurrency are converted to the workload's cycles: the NATS echo with the coordinator's requests per cycle, the bare Postgres insert with its rows per cycle. A goal at a concurrency this run did not measure is shown at its highest (${highest}), not checked.`,
    "",
    "| goal | required cycles/s | coordinator cycles/s | ratio | verdict | NATS echo batched / per message (cycles/s) | Postgres bare insert (cycles/s) |",
    `|${" --- |".repeat(7)}`
  ]
  const notes: Array<string> = []
  for (const goal of throughputGoals) {
    const title = `${goal.workload} at ${goal.level}: ≥ ${goal.factor}× ${labelOf(goal.baseline)}`
    const level = report.levels.includes(goal.level) ? goal.level : highest
    const coordinator = findRun(report.runs, goalTarget, goal.workload, level)
    const baseline = findRun(report.runs, goal.baseline, goal.workload, level)
    if (coordinator === undefined || baseline === undefined) {
      const missing = [
        ...(coordinator === undefined ? [labelOf(goalTarget)] : []),
        ...(baseline === undefined ? [labelOf(goal.baseline)] : [])
      ]
      lines.push(
        `| ${title} | n/a | n/a | n/a | not measured (${missing.join(" and ")} did not run ${goal.workload} at ${level}) | n/a | n/a |`
      )
      continue
    }
    const required = goal.factor * cyclesPerSecond(baseline)
    const reached = cyclesPerSecond(coordinator)
    const trouble = [
      ...(coordinator.errors > 0 ? [`${coordinator.errors} errors`] : []),
      ...(coordinator.overGrants > 0 ? [`${coordinator.overGrants} over-grants`] : []),
      ...(coordinator.drainedCleanly ? [] : ["did not drain"])
    ]
    // A run with errors, over-grants or cycles left hanging meets nothing, however fast it was.
    const verdict =
      level !== goal.level
        ? `not checked (measured at ${level})`
        : reached >= required && trouble.length === 0
          ? "**met**"
          : "**not met**"
    const ceilings = ceilingsAt(report, level, coordinator)
    const ceilingCells = report.ceilingsMeasured
      ? `${rate(ceilings.batched)} / ${rate(ceilings.perMessage)} | ${rate(ceilings.insert)}${ceilings.rows === undefined ? "" : ` (${ceilings.rows.toFixed(1)} rows/cycle)`}`
      : "not measured | not measured"
    lines.push(
      `| ${title} | ${formatRate(required)} (${goal.factor} × ${formatRate(cyclesPerSecond(baseline))}) | ${formatRate(reached)}${trouble.length > 0 ? ` (${trouble.join(", ")})` : ""} | ${cyclesPerSecond(baseline) > 0 ? `${(Math.floor((reached / cyclesPerSecond(baseline)) * 100) / 100).toFixed(2)}×` : "n/a"} | ${verdict} | ${ceilingCells} |`
    )
    const refused = [coordinator, baseline].filter((run) => run.refused > 0)
    const sentences = [
      ...refused.map(
        (run) =>
          `${labelOf(run.target)} refused ${run.refused} reserves in the window: not counted as cycles${goal.workload === "hot-granted" ? ", though this workload's user never reaches its limit" : ""}.`
      ),
      ...(report.ceilingsMeasured ? boundSentences(required, coordinator, ceilings) : []),
      ...saturation(coordinator, `the coordinator's run (${level} in flight)`),
      ...saturation(baseline, `${labelOf(goal.baseline)}'s run`)
    ]
    if (sentences.length > 0) notes.push(`- ${title}: ${sentences.join(" ")}`)
  }
  lines.push("", ...notes)
  lines.push(
    "",
    report.ceilingsMeasured
      ? rowsNote
      : "Ceilings were not measured (`--no-ceilings`): nothing here says whether a required value is within reach of this machine."
  )
  return lines
}

/**
 * Workloads whose coordinator cycles mostly end at a refusal (which writes nothing) while the echoes'
 * cycles write every command: there the durable echo does far more work than the coordinator, and its
 * p99 is no floor to hold it to.
 */
const refusalWorkloads: ReadonlySet<WorkloadKey> = new Set(["hot"])

/** The verdict of one coordinator half-peak run against its durable-echo floor. */
const p99Verdict = (run: OpenLoopResult, durable: OpenLoopResult): string => {
  if (refusalWorkloads.has(run.workload))
    return "no verdict: most of the coordinator's reserves are refused and write nothing, where the durable echo writes every command"
  if (!floorHeld(durable)) return "no verdict: the durable echo did not keep up (errors, drops or no drain)"
  const trouble = [
    ...(run.dropped > 0 ? [`${run.dropped} of ${run.offered} arrivals dropped`] : []),
    ...(run.errors > 0 ? [`${run.errors} errors`] : []),
    ...(run.overGrants > 0 ? [`${run.overGrants} over-grants`] : [])
  ]
  const met = run.latency.p99Ms <= p99FloorFactor * durable.latency.p99Ms && trouble.length === 0
  return `${met ? "**met**" : "**not met**"}${trouble.length > 0 ? ` (${trouble.join(", ")})` : ""}`
}

const latencyLines = (report: Report, labelOf: (key: string) => string): Array<string> => {
  const phase = report.halfPeak
  if (phase.skipped !== undefined) return [`Not measured: ${phase.skipped}.`]
  const measured = phase.runs.flatMap(({ run }) => {
    const { echo, durable } = floorsOf(phase.floors, run)
    return report.coordinatorKeys.includes(run.target) && durable !== undefined
      ? [{ run, echo, durable }]
      : []
  })
  if (measured.length === 0)
    return [`Not measured: no durable-echo floor ran${report.ceilingsMeasured ? "" : " (`--no-ceilings`)"}.`]
  return [
    `Each coordinator run at ${Math.round(phase.fraction * 100)}% of its peak (open loop) against the durable echo at the same offered rate, workload and way of sending (bench/floors.ts): required p99 ≤ ${p99FloorFactor}× the durable echo's, with nothing dropped, no errors and no over-grants. The durable echo's p99 is what NATS, one fsync'd group commit per batch and this bench cost at that rate; the NATS echo's (no database) and the bench's own start lag are given beside it. On hot and mix an echo's cycles carry every command, where the coordinator's stop at a refusal.`,
    "",
    "| coordinator target | workload | offered cycles/s | coordinator p99 ms | durable echo p99 ms | ratio | verdict | NATS echo p99 ms | coordinator's start lag p99 ms |",
    `|${" --- |".repeat(9)}`,
    ...measured.map(
      ({ run, echo, durable }) =>
        `| ${labelOf(run.target)} | ${run.workload} | ${formatRate(run.offeredPerSecond)} | ${formatMs(run.latency.p99Ms)} | ${formatMs(durable.latency.p99Ms)} | ${durable.latency.p99Ms > 0 ? `${(run.latency.p99Ms / durable.latency.p99Ms).toFixed(1)}×` : "n/a"} | ${p99Verdict(run, durable)} | ${echo === undefined ? "n/a" : formatMs(echo.latency.p99Ms)} | ${formatMs(run.startLag.p99Ms)} |`
    )
  ]
}

/** Issue 27's floor (bench/floorServer.ts) through the SDK, as the coordinator's goal target is sent. */
export const floorTarget = "floor"
/** Issue 27: the coordinator's cycles/s at least the floor's divided by this. */
const floorFactorMax = 1.2
/** Issue 27: Postgres CPU per uniform cycle, µs. */
const postgresMicrosPerCycleMax = 20
/** Issue 27: WAL per cycle, uniform and hot, bytes. */
const walBytesPerCycleMax = 500

const perCycleCell = (coordinator: number | undefined, floor: number | undefined, digits: number) =>
  `${coordinator === undefined ? "n/a" : coordinator.toFixed(digits)} / ${floor === undefined ? "n/a" : floor.toFixed(digits)}`

/** The verdict of the coordinator's run against the floor's at the same workload and concurrency. */
const floorVerdict = (coordinator: RunResult, floor: RunResult): string => {
  if (refusalWorkloads.has(coordinator.workload))
    return "no verdict: the floor grants every reserve the coordinator refuses, and its cycles carry every command"
  if (floor.errors > 0 || !floor.drainedCleanly)
    return "no verdict: the floor's run had errors or did not drain"
  const trouble = [
    ...(coordinator.errors > 0 ? [`${coordinator.errors} errors`] : []),
    ...(coordinator.overGrants > 0 ? [`${coordinator.overGrants} over-grants`] : []),
    ...(coordinator.drainedCleanly ? [] : ["did not drain"])
  ]
  const met = floorFactorMax * cyclesPerSecond(coordinator) >= cyclesPerSecond(floor) && trouble.length === 0
  return `${met ? "**met**" : "**not met**"}${trouble.length > 0 ? ` (${trouble.join(", ")})` : ""}`
}

const floorLines = (report: Report, labelOf: (key: string) => string): Array<string> => {
  const pairs = report.workloads.flatMap((workload) =>
    report.levels.flatMap((level) => {
      const coordinator = findRun(report.runs, goalTarget, workload.key, level)
      const floor = findRun(report.runs, floorTarget, workload.key, level)
      return coordinator === undefined || floor === undefined ? [] : [{ coordinator, floor }]
    })
  )
  if (pairs.length === 0)
    return [
      `Not measured: ${labelOf(goalTarget)} and ${labelOf(floorTarget)} did not both run a workload at one concurrency.`
    ]
  const highest = Math.max(...report.levels)
  const at = (workload: WorkloadKey) =>
    pairs.find((pair) => pair.coordinator.workload === workload && pair.coordinator.concurrency === highest)
  const uniform = at("uniform")
  const hot = at("hot")
  const perCycleSentence = (
    what: string,
    pair: (typeof pairs)[number] | undefined,
    value: (run: RunResult) => number | undefined,
    max: number,
    unit: string
  ): Array<string> => {
    if (pair === undefined) return []
    const coordinator = value(pair.coordinator)
    const floor = value(pair.floor)
    if (coordinator === undefined) return [`- ${what} at ${highest}: not measured.`]
    return [
      `- ${what} at ${highest}: coordinator ${coordinator.toFixed(0)} ${unit}, ${coordinator <= max ? "**met**" : "**not met**"} (goal ${max} ${unit}); the floor ${floor === undefined ? "n/a" : `${floor.toFixed(0)} ${unit}`}.`
    ]
  }
  return [
    `Issue 27: ${labelOf(goalTarget)} within ${floorFactorMax}× of ${labelOf(floorTarget)} (bench/floorServer.ts: the coordinator's NATS edge and decoding, its group commit, one fenced transaction appending one row per partition per group, a reply of the right shape; no decision, no actor) at the same workload and concurrency, cycles/s against cycles/s; Postgres CPU per cycle (every Postgres process the bench counts, from /proc: goal ${postgresMicrosPerCycleMax} µs on uniform) and WAL per cycle (the server's WAL position before and after the window, so every database's writes count: goal ${walBytesPerCycleMax} B on uniform and hot) for both. On hot the floor grants what the coordinator refuses: no verdict there.`,
    "",
    "| workload | in flight | coordinator cycles/s | floor cycles/s | floor ÷ coordinator | verdict | Postgres CPU µs / cycle, coordinator / floor | WAL B / cycle, coordinator / floor |",
    `|${" --- |".repeat(8)}`,
    ...pairs.map(({ coordinator, floor }) => {
      const ratio =
        cyclesPerSecond(coordinator) > 0
          ? `${(cyclesPerSecond(floor) / cyclesPerSecond(coordinator)).toFixed(2)}×`
          : "n/a"
      return `| ${coordinator.workload} | ${coordinator.concurrency} | ${formatRate(cyclesPerSecond(coordinator))} | ${formatRate(cyclesPerSecond(floor))} | ${ratio} | ${floorVerdict(coordinator, floor)} | ${perCycleCell(postgresMicrosPerCycle(coordinator), postgresMicrosPerCycle(floor), 1)} | ${perCycleCell(walBytesPerCycle(coordinator), walBytesPerCycle(floor), 0)} |`
    }),
    "",
    ...perCycleSentence(
      "Postgres CPU per uniform cycle",
      uniform,
      postgresMicrosPerCycle,
      postgresMicrosPerCycleMax,
      "µs"
    ),
    ...perCycleSentence("WAL per uniform cycle", uniform, walBytesPerCycle, walBytesPerCycleMax, "B"),
    ...perCycleSentence("WAL per hot cycle", hot, walBytesPerCycle, walBytesPerCycleMax, "B")
  ]
}

/** The "Goals against this run" section, as Markdown lines. */
export const renderGoals = (report: Report, labelOf: (key: string) => string): Array<string> => [
  "## Goals against this run",
  "",
  `Issue 16's goals, each computed from this run's numbers: ${throughputGoals.map((goal) => `${goal.workload} at ${goal.level} in flight ≥ ${goal.factor}× ${goal.baseline}`).join("; ")}; p99 at half of peak within ${p99FloorFactor}× the durable-echo floor, on every workload where a floor was measured.`,
  "",
  "### Throughput",
  "",
  ...throughputLines(report, labelOf),
  "",
  "### p99 at half of peak against the durable-echo floor",
  "",
  ...latencyLines(report, labelOf),
  "",
  "### Issue 27: the coordinator against its floor",
  "",
  ...floorLines(report, labelOf),
  ""
]
