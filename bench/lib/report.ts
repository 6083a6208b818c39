/**
 * The report: a Markdown page and an SVG chart (throughput and p99 against concurrency, one line per
 * target, one column per workload). Only what ran is shown; a target that did not run says why.
 */
import type { InsertCeiling } from "../ceilings.js"
import { formatCpu } from "./cpu.js"
import type { RunResult } from "./driver.js"
import { cyclesPerSecond } from "./driver.js"
import { formatMs, formatRate, perSecond } from "./format.js"
import { renderFloorsTable } from "./floorsReport.js"
import { p99GoalMs, p99Verdict, renderGoals } from "./goals.js"
import type { MachineInfo } from "./machine.js"
import type { OpenLoopResult } from "./openLoop.js"
import type { Workload, WorkloadKey } from "./workloads.js"

export interface TargetInfo {
  readonly key: string
  readonly label: string
  readonly durable: boolean
  readonly notes: ReadonlyArray<string>
  /** Set when the target did not run (not wired, failed to start). */
  readonly skipped?: string
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

const findRun = (runs: ReadonlyArray<RunResult>, target: string, workload: string, concurrency: number) =>
  runs.find((run) => run.target === target && run.workload === workload && run.concurrency === concurrency)

const ratio = (numerator: RunResult | undefined, denominator: RunResult): string => {
  if (numerator === undefined) return "n/a"
  const base = cyclesPerSecond(denominator)
  if (base === 0) return "n/a"
  return `${(cyclesPerSecond(numerator) / base).toFixed(2)}×`
}

const timestamp = (date: Date) => date.toISOString().replace("T", " ").slice(0, 16) + " UTC"

/** The "Latency at half of peak (open loop)" section, as Markdown lines. */
const renderHalfPeak = (report: Report, labelOf: (key: string) => string): Array<string> => {
  const phase = report.halfPeak
  const lines: Array<string> = ["## Latency at half of peak (open loop)", ""]
  if (phase.skipped !== undefined) return [...lines, `Not run: ${phase.skipped}.`, ""]
  const percent = Math.round(phase.fraction * 100)
  lines.push(
    `After the closed-loop levels of a workload (${phase.workloads.join(", ")}), each of these targets is offered ${percent}% of the most cycles/s it reached in them, in an open loop: cycles arrive at that mean rate (Poisson arrivals, seeded) whether or not earlier ones were answered, ${report.warmupMs} ms warm-up then ${report.measureMs} ms measured. Latencies are per request, the first request of a cycle timed from the cycle's place in the schedule (no coordinated omission: a stall delays the arrivals behind it, and they count it); *cycle p99* is a whole cycle from its scheduled start; *start lag* is how late the bench itself started cycles (timer granularity, its own CPU), already inside the latencies. At most ${phase.inFlightMax} cycles in flight: an arrival beyond that is *dropped* (not started) and counted. *Most in flight* is the highest number of cycles in flight at once.`
  )
  lines.push("")
  lines.push(
    "| target | workload | peak cycles/s (in flight) | offered cycles/s | achieved cycles/s | dropped | most in flight | p50 | p99 | p99.9 | cycle p99 | start lag p99 | errors | over-grants | CPU % while measured |"
  )
  lines.push(`|${" --- |".repeat(15)}`)
  for (const { peak, run } of phase.runs) {
    const flags = run.drainedCleanly ? "" : " (did not drain)"
    const warmupDrops = run.droppedInWarmup > 0 ? ` (+${run.droppedInWarmup} in warm-up)` : ""
    lines.push(
      `| ${labelOf(run.target)}${flags} | ${run.workload} | ${formatRate(cyclesPerSecond(peak))} (${peak.concurrency}) | ${formatRate(run.offeredPerSecond)} | ${formatRate(cyclesPerSecond(run))} | ${run.dropped} of ${run.offered}${warmupDrops} | ${run.concurrency} | ${formatMs(run.latency.p50Ms)} | ${formatMs(run.latency.p99Ms)} | ${formatMs(run.latency.p999Ms)} | ${formatMs(run.cycleLatency.p99Ms)} | ${formatMs(run.startLag.p99Ms)} | ${run.errors} | ${run.overGrants} | ${formatCpu(run.cpu, report.machine.cores)} |`
    )
  }
  const coordinatorRuns = phase.runs.filter(({ run }) => report.coordinatorKeys.includes(run.target))
  if (coordinatorRuns.length > 0) {
    lines.push("")
    lines.push(`p99 ≤ ${p99GoalMs} ms at ${percent}% of peak (the issue's goal), per coordinator target:`)
    lines.push("")
    for (const { peak, run } of coordinatorRuns) {
      lines.push(
        `- ${labelOf(run.target)}, ${run.workload}, ${formatRate(run.offeredPerSecond)} cycles/s offered (${percent}% of ${formatRate(cyclesPerSecond(peak))} at ${peak.concurrency} in flight): ${p99Verdict(run).text}.`
      )
    }
  }
  if (coordinatorRuns.length > 0) lines.push("")
  lines.push(...renderFloorsTable(coordinatorRuns, phase.floors, labelOf, report.machine.cores))
  const errorsSeen = phase.runs.filter(({ run }) => run.firstError !== undefined)
  if (errorsSeen.length > 0) {
    lines.push("")
    lines.push("First error (or client retries) seen per open-loop run, warm-up and drain included:")
    lines.push("")
    for (const { run } of errorsSeen)
      lines.push(`- ${labelOf(run.target)}, ${run.workload}: \`${run.firstError}\``)
  }
  lines.push("")
  return lines
}

export const renderMarkdown = (report: Report, chartFile: string): string => {
  const lines: Array<string> = []
  const labelOf = (key: string) => report.targets.find((target) => target.key === key)?.label ?? key
  const coordinators = report.coordinatorKeys.filter((key) => report.runs.some((run) => run.target === key))
  lines.push(`# quota-coordinator benchmark (${report.mode}), ${timestamp(report.startedAt)}`)
  lines.push("")
  lines.push(
    `Machine: ${report.machine.cpuModel}, ${report.machine.cores} cores, ${report.machine.memoryGiB} GiB, Node ${report.machine.node}, ${report.machine.platform}. Code: ${report.machine.code}.`
  )
  lines.push(`Services on the same machine, over loopback: ${report.services.join("; ")}.`)
  lines.push(
    `The bench client, the coordinator process and the servers all share the ${report.machine.cores} cores: every number here is bounded by that. Load average when the bench started: ${report.loadAverage.map((load) => load.toFixed(2)).join(", ")} (1, 5, 15 min); the *CPU %* column says, per run, where the cores went (*other*: processes the bench did not start or measure apart, e.g. other jobs on the machine).`
  )
  lines.push(
    `Runs: concurrency ${report.levels.join(", ")} (workers in flight, closed loop); ${report.warmupMs} ms warm-up + ${report.measureMs} ms measured each. Finished ${timestamp(report.finishedAt)}.`
  )
  lines.push("")
  lines.push(`![throughput and p99 against concurrency](${chartFile})`)
  lines.push("")
  lines.push("## Targets")
  lines.push("")
  for (const target of report.targets) {
    const status = target.skipped === undefined ? "" : ` **Not run: ${target.skipped}**`
    lines.push(
      `- **${target.label}** (\`${target.key}\`; ${target.durable ? "durable" : "NOT durable"}).${status}`
    )
    for (const note of target.notes) lines.push(`  - ${note}`)
  }
  lines.push("")
  lines.push(
    "Columns: *cycles/s* is the workload's unit of work (a job's whole life) per second, the comparable number; *req/s* counts requests actually sent (designs differ in how many a cycle needs); latencies are per request, in ms; *granted*/*refused*/*errors* count reserves and slot acquisitions in the measured window (errors: any request without a decision); *over-grants* counts grants that took the independent tally of granted amounts past the limit over the whole run (a floor: see bench/lib/tally.ts); *batch* is requests per NATS message; the last columns are the coordinator's cycles/s divided by the row's."
  )
  for (const workload of report.workloads) {
    lines.push("")
    lines.push(`## ${workload.title}`)
    lines.push("")
    lines.push(workload.description)
    lines.push("")
    const ratioHeads = coordinators.map((key) => `${labelOf(key)} ÷ this`)
    lines.push(
      `| target | in flight | cycles/s | req/s | p50 | p99 | p99.9 | granted | refused | errors | over-grants | batch | ${ratioHeads.map((head) => `${head} | `).join("")}CPU % while measured |`
    )
    lines.push(`|${" --- |".repeat(13 + ratioHeads.length)}`)
    for (const concurrency of report.levels) {
      for (const target of report.targets) {
        const run = findRun(report.runs, target.key, workload.key, concurrency)
        if (run === undefined) continue
        const ratios = coordinators.map((key) =>
          report.coordinatorKeys.includes(run.target)
            ? "—"
            : ratio(findRun(report.runs, key, workload.key, concurrency), run)
        )
        const flags = run.drainedCleanly ? "" : " (did not drain)"
        lines.push(
          `| ${target.label}${flags} | ${concurrency} | ${formatRate(cyclesPerSecond(run))} | ${formatRate(perSecond(run.requests, run.measuredMs))} | ${formatMs(run.latency.p50Ms)} | ${formatMs(run.latency.p99Ms)} | ${formatMs(run.latency.p999Ms)} | ${run.granted} | ${run.refused} | ${run.errors} | ${run.overGrants} | ${run.meanBatch.toFixed(1)} | ${ratios.map((cell) => `${cell} | `).join("")}${formatCpu(run.cpu, report.machine.cores)} |`
        )
      }
    }
    const errorsSeen = report.runs.filter(
      (run) => run.workload === workload.key && run.firstError !== undefined
    )
    if (errorsSeen.length > 0) {
      lines.push("")
      lines.push(
        "First error (or client retries) seen per run, warm-up and drain included (the *errors* column counts only the measured window):"
      )
      lines.push("")
      for (const run of errorsSeen) {
        lines.push(`- ${labelOf(run.target)} at ${run.concurrency}: \`${run.firstError}\``)
      }
    }
  }
  lines.push("")
  lines.push(...renderHalfPeak(report, labelOf))
  lines.push("## Ceilings, measured in the same run")
  lines.push("")
  if (!report.ceilingsMeasured) lines.push("Not measured: `--no-ceilings`.", "")
  if (report.echo.length > 0) {
    lines.push(
      "NATS request/reply to an echo service in its own process (answers each request with its bytes; no decision, no database), same uniform workload, same concurrency; *batched* uses the bench's coalescer (commands issued before the same microtask checkpoint, per partition, one message, as the SDK does)."
    )
    lines.push("")
    lines.push(
      "| path | in flight | cycles/s | req/s | messages/s | p50 | p99 | p99.9 | batch | CPU % while measured |"
    )
    lines.push(`|${" --- |".repeat(10)}`)
    for (const run of report.echo) {
      lines.push(
        `| ${run.label} | ${run.concurrency} | ${formatRate(cyclesPerSecond(run))} | ${formatRate(perSecond(run.requests, run.measuredMs))} | ${formatRate(perSecond(run.requests, run.measuredMs) / Math.max(1, run.meanBatch))} | ${formatMs(run.latency.p50Ms)} | ${formatMs(run.latency.p99Ms)} | ${formatMs(run.latency.p999Ms)} | ${run.meanBatch.toFixed(1)} | ${formatCpu(run.cpu, report.machine.cores)} |`
      )
    }
    lines.push("")
  }
  if (report.inserts.length > 0) {
    lines.push(
      "Postgres: a bare `insert ... select * from unnest(...)` of hold-shaped rows (primary key, no other index), one writer, one fsync'd commit per statement: what a group commit of N decisions costs at best. The Postgres server (and its WAL fsync) is shared with whatever else runs on it; *other* CPU hints at that load."
    )
    lines.push("")
    lines.push("| rows per commit | commits/s | rows/s | commit p50 | commit p99 | CPU % while measured |")
    lines.push(`|${" --- |".repeat(6)}`)
    for (const insert of report.inserts) {
      lines.push(
        `| ${insert.batchRows} | ${formatRate(insert.commitsPerSecond)} | ${formatRate(insert.rowsPerSecond)} | ${formatMs(insert.latency.p50Ms)} | ${formatMs(insert.latency.p99Ms)} | ${formatCpu(insert.cpu, report.machine.cores)} |`
      )
    }
    lines.push("")
  }
  lines.push(...renderGoals(report, labelOf))
  if (report.remarks.length > 0) {
    lines.push("## Remarks")
    lines.push("")
    for (const remark of report.remarks) lines.push(`- ${remark}`)
    lines.push("")
  }
  return lines.join("\n")
}

const palette = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#17becf", "#7f7f7f"]

const escapeXml = (text: string) =>
  text.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;")

/** Powers of ten covering [min, max] for a log axis. */
const decades = (min: number, max: number): Array<number> => {
  const from = Math.floor(Math.log10(Math.max(min, 1e-3)))
  const to = Math.max(from + 1, Math.ceil(Math.log10(Math.max(max, 1e-3))))
  return Array.from({ length: to - from + 1 }, (_, index) => 10 ** (from + index))
}

export const renderSvg = (report: Report): string => {
  const panelWidth = 300
  const panelHeight = 210
  const margin = { left: 60, right: 16, top: 34, bottom: 38 }
  const columns = report.workloads.length
  const targets = report.targets.filter((target) => report.runs.some((run) => run.target === target.key))
  const legendHeight = 20 * Math.ceil(targets.length / 2) + 10
  const width = columns * (panelWidth + margin.left + margin.right)
  const height = 2 * (panelHeight + margin.top + margin.bottom) + legendHeight + 40
  const parts: Array<string> = []
  parts.push(
    `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}" font-family="sans-serif" font-size="11">`
  )
  parts.push(`<rect width="${width}" height="${height}" fill="white"/>`)
  parts.push(
    `<text x="10" y="18" font-size="13" font-weight="bold">${escapeXml(`quota-coordinator bench (${report.mode}) ${timestamp(report.startedAt)}: throughput and p99 vs concurrency (log-log)`)}</text>`
  )
  const xs = report.levels
  const xMin = Math.min(...xs)
  const xMax = Math.max(...xs)
  const xOf = (value: number, left: number) =>
    xMax === xMin
      ? left + panelWidth / 2
      : left + ((Math.log10(value) - Math.log10(xMin)) / (Math.log10(xMax) - Math.log10(xMin))) * panelWidth

  const metrics: ReadonlyArray<{ title: string; value: (run: RunResult) => number }> = [
    { title: "cycles/s", value: (run) => cyclesPerSecond(run) },
    { title: "p99 latency, ms", value: (run) => run.latency.p99Ms }
  ]
  metrics.forEach((metric, row) => {
    report.workloads.forEach((workload, column) => {
      const left = column * (panelWidth + margin.left + margin.right) + margin.left
      const top = 30 + row * (panelHeight + margin.top + margin.bottom) + margin.top
      const runs = report.runs.filter((run) => run.workload === workload.key)
      const values = runs.map(metric.value).filter((value) => value > 0)
      const ticks = values.length === 0 ? [1, 10] : decades(Math.min(...values), Math.max(...values))
      const yMin = ticks[0]!
      const yMax = ticks[ticks.length - 1]!
      const yOf = (value: number) =>
        top +
        panelHeight -
        ((Math.log10(Math.max(value, yMin)) - Math.log10(yMin)) / (Math.log10(yMax) - Math.log10(yMin))) *
          panelHeight
      parts.push(
        `<text x="${left}" y="${top - 8}" font-weight="bold">${escapeXml(`${workload.title}: ${metric.title}`)}</text>`
      )
      parts.push(
        `<rect x="${left}" y="${top}" width="${panelWidth}" height="${panelHeight}" fill="none" stroke="#999"/>`
      )
      for (const tick of ticks) {
        const y = yOf(tick)
        parts.push(`<line x1="${left}" x2="${left + panelWidth}" y1="${y}" y2="${y}" stroke="#eee"/>`)
        parts.push(
          `<text x="${left - 4}" y="${y + 4}" text-anchor="end">${tick >= 1 ? tick.toLocaleString("en-US") : String(Number(tick.toPrecision(1)))}</text>`
        )
      }
      for (const level of xs) {
        const x = xOf(level, left)
        parts.push(`<line x1="${x}" x2="${x}" y1="${top}" y2="${top + panelHeight}" stroke="#eee"/>`)
        parts.push(`<text x="${x}" y="${top + panelHeight + 14}" text-anchor="middle">${level}</text>`)
      }
      parts.push(
        `<text x="${left + panelWidth / 2}" y="${top + panelHeight + 30}" text-anchor="middle">in flight</text>`
      )
      targets.forEach((target, index) => {
        const points = xs.flatMap((level) => {
          const run = findRun(runs, target.key, workload.key, level)
          if (run === undefined) return []
          const value = metric.value(run)
          return value > 0 ? [[xOf(level, left), yOf(value)] as const] : []
        })
        if (points.length === 0) return
        const color = palette[index % palette.length]!
        const dash = target.durable ? "" : ` stroke-dasharray="5,3"`
        parts.push(
          `<polyline fill="none" stroke="${color}" stroke-width="2"${dash} points="${points.map(([x, y]) => `${x.toFixed(1)},${y.toFixed(1)}`).join(" ")}"/>`
        )
        for (const [x, y] of points)
          parts.push(`<circle cx="${x.toFixed(1)}" cy="${y.toFixed(1)}" r="3" fill="${color}"/>`)
      })
    })
  })
  const legendTop = height - legendHeight + 6
  targets.forEach((target, index) => {
    const x = 10 + (index % 2) * (width / 2)
    const y = legendTop + 20 * Math.floor(index / 2)
    const color = palette[index % palette.length]!
    const dash = target.durable ? "" : ` stroke-dasharray="5,3"`
    parts.push(
      `<line x1="${x}" x2="${x + 24}" y1="${y}" y2="${y}" stroke="${color}" stroke-width="2"${dash}/>`
    )
    parts.push(
      `<text x="${x + 30}" y="${y + 4}">${escapeXml(target.label + (target.durable ? "" : " (dashed)"))}</text>`
    )
  })
  parts.push("</svg>")
  return parts.join("\n")
}
