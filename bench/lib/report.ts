/**
 * The report: a Markdown page and an SVG chart (throughput and p99 against concurrency, one line per
 * target, one column per workload). Only what ran is shown; a target that did not run says why.
 */
import { storeWritersMax } from "../../src/domain/limits.js"
import { formatCpu } from "./cpu.js"
import { formatMs, formatRate, table } from "./format.js"
import { renderGoals } from "./goals.js"
import type { OpenLoopResult, Report, RunResult } from "./results.js"
import {
  cyclesPerSecond,
  findRun,
  floorsOf,
  perSecond,
  postgresMicrosPerCycle,
  walBytesPerCycle
} from "./results.js"
import type { Workload } from "./workloads.js"

const ratio = (numerator: RunResult | undefined, denominator: RunResult): string =>
  numerator === undefined || cyclesPerSecond(denominator) === 0
    ? "n/a"
    : `${(cyclesPerSecond(numerator) / cyclesPerSecond(denominator)).toFixed(2)}×`

const timestamp = (date: Date) => date.toISOString().replace("T", " ").slice(0, 16) + " UTC"

const requestsPerSecond = (run: RunResult) => formatRate(perSecond(run.requests, run.measuredMs))

const latencyCell = (run: OpenLoopResult | undefined): string => {
  if (run === undefined) return "not measured"
  const trouble = [
    ...(run.errors > 0 ? [`${run.errors} errors`] : []),
    ...(run.dropped > 0 ? [`${run.dropped} of ${run.offered} dropped`] : []),
    ...(run.drainedCleanly ? [] : ["did not drain"])
  ]
  return `${formatMs(run.latency.p50Ms)} / ${formatMs(run.latency.p99Ms)} (${formatMs(run.startLag.p99Ms)})${trouble.length > 0 ? `, ${trouble.join(", ")}` : ""}`
}

/** The first error (or client retries) of each run that had one, as a list under `title`. */
const firstErrors = (title: string, entries: ReadonlyArray<readonly [string, RunResult]>): Array<string> => {
  const seen = entries.filter(([, run]) => run.firstError !== undefined)
  return seen.length === 0
    ? []
    : ["", title, "", ...seen.map(([what, run]) => `- ${what}: \`${run.firstError}\``)]
}

/** The floors (bench/floors.ts) beside the coordinator's half-peak runs. */
const renderFloors = (report: Report, labelOf: (key: string) => string): Array<string> => {
  const { floors, runs } = report.halfPeak
  if (floors.length === 0) return []
  const coordinatorRuns = runs.filter(({ run }) => report.coordinatorKeys.includes(run.target))
  return [
    "",
    "### Floors at the same offered rates",
    "",
    `Each coordinator run above repeated at the same offered rate and workload, sending the same way (one command per message, or commands coalesced per microtask by the bench's coalescer; unlike the SDK it does not wait for a partition's message in flight), against two far sides that decide nothing (bench/floors.ts): the *NATS echo* answers each request with its own bytes; the *durable echo* answers only after one hold-shaped row per command is committed (fsync'd) in Postgres, with group commit as the coordinator does (up to ${storeWritersMax} commits in flight). Cells are p50 / p99 (start lag p99), in ms: what NATS, Postgres's commits and this bench cost at that rate on this machine. They are references, not strict bounds: an echo answers every step \`ok\`, so in the hot and mix workloads its cycles carry every command (and the durable echo writes a row for each), where the coordinator's end early on a refusal; the coordinator writes up to three rows per command, in up to three tables, and none for a refusal.`,
    "",
    ...table(
      [
        "coordinator target",
        "workload",
        "offered cycles/s",
        "coordinator",
        "NATS echo",
        "durable echo",
        "durable echo: CPU % while measured"
      ],
      coordinatorRuns.map(({ run }) => {
        const { echo, durable } = floorsOf(floors, run)
        return [
          labelOf(run.target),
          run.workload,
          formatRate(run.offeredPerSecond),
          latencyCell(run),
          latencyCell(echo),
          latencyCell(durable),
          durable === undefined ? "" : formatCpu(durable.cpu, report.machine.cores)
        ]
      })
    )
  ]
}

/** The "Latency at half of peak (open loop)" section, as Markdown lines. */
const renderHalfPeak = (report: Report, labelOf: (key: string) => string): Array<string> => {
  const phase = report.halfPeak
  const title = "## Latency at half of peak (open loop)"
  if (phase.skipped !== undefined) return [title, "", `Not run: ${phase.skipped}.`, ""]
  return [
    title,
    "",
    `After the closed-loop levels of a workload (${phase.workloads.join(", ")}), each of these targets is offered ${Math.round(phase.fraction * 100)}% of the most cycles/s it reached in them, in an open loop: cycles arrive at that mean rate (Poisson arrivals, seeded) whether or not earlier ones were answered, ${report.warmupMs} ms warm-up then ${report.measureMs} ms measured. Latencies are per request, the first request of a cycle timed from the cycle's place in the schedule (no coordinated omission: a stall delays the arrivals behind it, and they count it); *cycle p99* is a whole cycle from its scheduled start; *start lag* is how late the bench itself started cycles (timer granularity, its own CPU), already inside the latencies. At most ${phase.inFlightMax} cycles in flight: an arrival beyond that is *dropped* (not started) and counted. *Most in flight* is the highest number of cycles in flight at once.`,
    "",
    ...table(
      [
        "target",
        "workload",
        "peak cycles/s (in flight)",
        "offered cycles/s",
        "achieved cycles/s",
        "dropped",
        "most in flight",
        "p50",
        "p99",
        "p99.9",
        "cycle p99",
        "start lag p99",
        "errors",
        "over-grants",
        "CPU % while measured"
      ],
      phase.runs.map(({ peak, run }) => [
        `${labelOf(run.target)}${run.drainedCleanly ? "" : " (did not drain)"}`,
        run.workload,
        `${formatRate(cyclesPerSecond(peak))} (${peak.concurrency})`,
        formatRate(run.offeredPerSecond),
        formatRate(cyclesPerSecond(run)),
        `${run.dropped} of ${run.offered}${run.droppedInWarmup > 0 ? ` (+${run.droppedInWarmup} in warm-up)` : ""}`,
        run.concurrency,
        formatMs(run.latency.p50Ms),
        formatMs(run.latency.p99Ms),
        formatMs(run.latency.p999Ms),
        formatMs(run.cycleLatency.p99Ms),
        formatMs(run.startLag.p99Ms),
        run.errors,
        run.overGrants,
        formatCpu(run.cpu, report.machine.cores)
      ])
    ),
    ...renderFloors(report, labelOf),
    ...firstErrors(
      "First error (or client retries) seen per open-loop run, warm-up and drain included:",
      phase.runs.map(({ run }) => [`${labelOf(run.target)}, ${run.workload}`, run] as const)
    ),
    ""
  ]
}

/** One table per workload: every target at every concurrency, with the coordinator's ratios. */
const renderWorkload = (report: Report, workload: Workload, labelOf: (key: string) => string) => {
  const coordinators = report.coordinatorKeys.filter((key) => report.runs.some((run) => run.target === key))
  const runs = report.levels.flatMap((level) =>
    report.targets.flatMap((target) => findRun(report.runs, target.key, workload.key, level) ?? [])
  )
  return [
    "",
    `## ${workload.title}`,
    "",
    workload.description,
    "",
    ...table(
      [
        "target",
        "in flight",
        "cycles/s",
        "req/s",
        "p50",
        "p99",
        "p99.9",
        "granted",
        "refused",
        "errors",
        "over-grants",
        "batch",
        ...coordinators.map((key) => `${labelOf(key)} ÷ this`),
        "Postgres CPU µs / cycle",
        "WAL B / cycle",
        "CPU % while measured"
      ],
      runs.map((run) => [
        `${labelOf(run.target)}${run.drainedCleanly ? "" : " (did not drain)"}`,
        run.concurrency,
        formatRate(cyclesPerSecond(run)),
        requestsPerSecond(run),
        formatMs(run.latency.p50Ms),
        formatMs(run.latency.p99Ms),
        formatMs(run.latency.p999Ms),
        run.granted,
        run.refused,
        run.errors,
        run.overGrants,
        run.meanBatch.toFixed(1),
        ...coordinators.map((key) =>
          report.coordinatorKeys.includes(run.target)
            ? "—"
            : ratio(findRun(report.runs, key, workload.key, run.concurrency), run)
        ),
        postgresMicrosPerCycle(run)?.toFixed(1) ?? "n/a",
        walBytesPerCycle(run)?.toFixed(0) ?? "n/a",
        formatCpu(run.cpu, report.machine.cores)
      ])
    ),
    ...firstErrors(
      "First error (or client retries) seen per run, warm-up and drain included (the *errors* column counts only the measured window):",
      runs.map((run) => [`${labelOf(run.target)} at ${run.concurrency}`, run] as const)
    )
  ]
}

/** The NATS echo and bare-insert ceilings. */
const renderCeilings = (report: Report): Array<string> => [
  "## Ceilings, measured in the same run",
  "",
  ...(report.ceilingsMeasured ? [] : ["Not measured: `--no-ceilings`.", ""]),
  ...(report.echo.length === 0
    ? []
    : [
        "NATS request/reply to an echo service in its own process (answers each request with its bytes; no decision, no database), same uniform workload, same concurrency; *batched* uses the bench's coalescer (commands issued before the same microtask checkpoint, per partition, one message, as the SDK does).",
        "",
        ...table(
          [
            "path",
            "in flight",
            "cycles/s",
            "req/s",
            "messages/s",
            "p50",
            "p99",
            "p99.9",
            "batch",
            "CPU % while measured"
          ],
          report.echo.map((run) => [
            run.label,
            run.concurrency,
            formatRate(cyclesPerSecond(run)),
            requestsPerSecond(run),
            formatRate(perSecond(run.requests, run.measuredMs) / Math.max(1, run.meanBatch)),
            formatMs(run.latency.p50Ms),
            formatMs(run.latency.p99Ms),
            formatMs(run.latency.p999Ms),
            run.meanBatch.toFixed(1),
            formatCpu(run.cpu, report.machine.cores)
          ])
        ),
        ""
      ]),
  ...(report.inserts.length === 0
    ? []
    : [
        "Postgres: a bare `insert ... select * from unnest(...)` of hold-shaped rows (primary key, no other index), one writer, one fsync'd commit per statement: what a group commit of N decisions costs at best. The Postgres server (and its WAL fsync) is shared with whatever else runs on it; *other* CPU hints at that load.",
        "",
        ...table(
          ["rows per commit", "commits/s", "rows/s", "commit p50", "commit p99", "CPU % while measured"],
          report.inserts.map((insert) => [
            insert.batchRows,
            formatRate(insert.commitsPerSecond),
            formatRate(insert.rowsPerSecond),
            formatMs(insert.latency.p50Ms),
            formatMs(insert.latency.p99Ms),
            formatCpu(insert.cpu, report.machine.cores)
          ])
        ),
        ""
      ])
]

export const renderMarkdown = (report: Report, chartFile: string): string => {
  const labelOf = (key: string) => report.targets.find((target) => target.key === key)?.label ?? key
  const { machine } = report
  return [
    `# quota-coordinator benchmark (${report.mode}), ${timestamp(report.startedAt)}`,
    "",
    `Machine: ${machine.cpuModel}, ${machine.cores} cores, ${machine.memoryGiB} GiB, Node ${machine.node}, ${machine.platform}. Code: ${machine.code}.`,
    `Services on the same machine, over loopback: ${report.services.join("; ")}.`,
    `The bench client, the coordinator process and the servers all share the ${machine.cores} cores: every number here is bounded by that. Load average when the bench started: ${report.loadAverage.map((load) => load.toFixed(2)).join(", ")} (1, 5, 15 min); the *CPU %* column says, per run, where the cores went (*other*: processes the bench did not start or measure apart, e.g. other jobs on the machine).`,
    `Runs: concurrency ${report.levels.join(", ")} (workers in flight, closed loop); ${report.warmupMs} ms warm-up + ${report.measureMs} ms measured each. Finished ${timestamp(report.finishedAt)}.`,
    "",
    `![throughput and p99 against concurrency](${chartFile})`,
    "",
    "## Targets",
    "",
    ...report.targets.flatMap((target) => [
      `- **${target.label}** (\`${target.key}\`; ${target.durable ? "durable" : "NOT durable"}).${target.skipped === undefined ? "" : ` **Not run: ${target.skipped}**`}`,
      ...target.notes.map((note) => `  - ${note}`)
    ]),
    "",
    "Columns: *cycles/s* is the workload's unit of work (a job's whole life) per second, the comparable number; *req/s* counts requests actually sent (designs differ in how many a cycle needs); latencies are per request, in ms; *granted*/*refused*/*errors* count reserves and slot acquisitions in the measured window (errors: any request without a decision); *over-grants* counts grants that took the independent tally of granted amounts past the limit over the whole run (a floor: see bench/lib/tally.ts); *batch* is requests per NATS message; then the coordinator's cycles/s divided by the row's; *Postgres CPU µs / cycle* is the CPU of every Postgres process the bench counts (its databases' backends and the server's own processes, from /proc) over the window's cycles; *WAL B / cycle* the server's WAL written during the window (every database's, other jobs' included) over its cycles.",
    ...report.workloads.flatMap((workload) => renderWorkload(report, workload, labelOf)),
    "",
    ...renderHalfPeak(report, labelOf),
    ...renderCeilings(report),
    ...renderGoals(report, labelOf),
    ...(report.remarks.length === 0
      ? []
      : ["## Remarks", "", ...report.remarks.map((remark) => `- ${remark}`), ""])
  ].join("\n")
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
