/**
 * bench/lib/goals.ts on hand-made reports: each throughput goal's verdict from cycles/s at the goal's
 * concurrency, the ceiling sentence, and the p99 verdict against the durable-echo floor.
 */
import { describe, expect, it } from "vitest"
import type { CpuShares } from "../../bench/lib/cpu.js"
import { formatMs } from "../../bench/lib/format.js"
import { renderGoals } from "../../bench/lib/goals.js"
import type { LatencySummary } from "../../bench/lib/latency.js"
import type { FloorRun, OpenLoopResult, Report, RunResult } from "../../bench/lib/results.js"
import type { WorkloadKey } from "../../bench/lib/workloads.js"

const latency = (p99Ms: number): LatencySummary => ({
  count: 1000,
  p50Ms: p99Ms / 2,
  p99Ms,
  p999Ms: p99Ms,
  maxMs: p99Ms
})
const cpu: CpuShares = {
  bench: 20,
  server: 20,
  serverLabel: "coord",
  postgres: 0,
  redis: 0,
  nats: 0,
  other: 0,
  machine: 30
}

/** A closed-loop run: 1,000 cycles/s of uniform at 4096 in flight, 4 requests a cycle, nothing wrong. */
const runOf = (overrides: Partial<RunResult>): RunResult => ({
  target: "coord-sdk",
  workload: "uniform",
  concurrency: 4096,
  measuredMs: 1000,
  cycles: 1000,
  requests: 4000,
  applied: { reserve: 1000, consume: 1000, commit: 1000, release: 1000, acquire_slot: 0, release_slot: 0 },
  granted: 1000,
  refused: 0,
  errors: 0,
  overGrants: 0,
  latency: latency(1),
  meanBatch: 1,
  drainedCleanly: true,
  cpu,
  walBytes: undefined,
  firstError: undefined,
  ...overrides
})

const openLoopOf = (overrides: Partial<OpenLoopResult>): OpenLoopResult => ({
  ...runOf(overrides),
  offeredPerSecond: 500,
  offered: 1000,
  dropped: 0,
  droppedInWarmup: 0,
  inFlightMax: 8192,
  cycleLatency: latency(1),
  startLag: latency(0.1),
  ...overrides
})

const reportOf = (overrides: Partial<Report>): Report => ({
  mode: "quick",
  startedAt: new Date(0),
  finishedAt: new Date(0),
  machine: { cpuModel: "test", cores: 8, memoryGiB: 16, node: "v22", platform: "test", code: "abc" },
  services: [],
  loadAverage: [],
  levels: [16, 256, 4096],
  warmupMs: 0,
  measureMs: 1000,
  workloads: [],
  targets: [],
  coordinatorKeys: ["coord-sdk", "coord-msg"],
  runs: [],
  echo: [],
  inserts: [],
  ceilingsMeasured: false,
  halfPeak: { fraction: 0.5, inFlightMax: 8192, workloads: [], runs: [], floors: [] },
  remarks: [],
  ...overrides
})

const render = (report: Report) => renderGoals(report, (key) => key)

/** The cells of the one table row that starts with `start`. */
const cellsOf = (lines: ReadonlyArray<string>, start: string): Array<string> => {
  const rows = lines.filter((line) => line.startsWith(start))
  expect(rows, start).toHaveLength(1)
  return (rows[0] ?? "")
    .split("|")
    .slice(1, -1)
    .map((cell) => cell.trim())
}
const throughputRow = (lines: ReadonlyArray<string>, title: string) => cellsOf(lines, `| ${title} |`)
const verdictOf = (lines: ReadonlyArray<string>, title: string) => throughputRow(lines, title)[4]

const goals: ReadonlyArray<{ workload: WorkloadKey; level: number; baseline: string; factor: number }> = [
  { workload: "uniform", level: 4096, baseline: "seed004", factor: 5 },
  { workload: "uniform", level: 256, baseline: "seed004", factor: 2.5 },
  { workload: "hot-granted", level: 4096, baseline: "seed004", factor: 50 },
  { workload: "hot-granted", level: 4096, baseline: "seed003", factor: 2 },
  { workload: "mix", level: 4096, baseline: "seed004", factor: 3 }
]
const titleOf = (goal: (typeof goals)[number]) =>
  `${goal.workload} at ${goal.level}: ≥ ${goal.factor}× ${goal.baseline}`

describe("renderGoals: throughput", () => {
  // The baseline at 1,000 cycles/s (1,000 cycles in 1 s), the coordinator measured over 2 s: its
  // cycles/s, not its cycle count, is what the factor applies to.
  it.each(
    goals.flatMap((goal) => [
      { ...goal, ratio: goal.factor, verdict: "**met**" },
      { ...goal, ratio: goal.factor - 0.01, verdict: "**not met**" }
    ])
  )("$workload at $level vs $baseline ×$factor: $ratio× is $verdict", (goal) => {
    const at = { workload: goal.workload, concurrency: goal.level }
    const lines = render(
      reportOf({
        runs: [
          runOf({ ...at, target: goal.baseline }),
          runOf({ ...at, target: "coord-sdk", measuredMs: 2000, cycles: Math.round(goal.ratio * 2000) })
        ]
      })
    )
    const row = throughputRow(lines, titleOf(goal))
    expect(row[1]).toBe(`${(goal.factor * 1000).toLocaleString("en-US")} (${goal.factor} × 1,000)`)
    expect(row[2]).toBe(Math.round(goal.ratio * 1000).toLocaleString("en-US"))
    expect(row[3]).toBe(`${goal.ratio.toFixed(2)}×`)
    expect(row[4]).toBe(goal.verdict)
  })

  it.each([
    { trouble: { errors: 2 }, cell: "10,000 (2 errors)", verdict: "**not met**" },
    { trouble: { overGrants: 3 }, cell: "10,000 (3 over-grants)", verdict: "**not met**" },
    { trouble: { drainedCleanly: false }, cell: "10,000 (did not drain)", verdict: "**not met**" },
    { trouble: {}, cell: "10,000", verdict: "**met**" }
  ])("a run 10× the baseline with $cell is $verdict", ({ trouble, cell, verdict }) => {
    const at = { workload: "uniform" as const, concurrency: 4096 }
    const lines = render(
      reportOf({
        runs: [
          runOf({ ...at, target: "seed004" }),
          runOf({ ...at, target: "coord-sdk", cycles: 10_000, ...trouble })
        ]
      })
    )
    const row = throughputRow(lines, "uniform at 4096: ≥ 5× seed004")
    expect(row[2]).toBe(cell)
    expect(row[4]).toBe(verdict)
  })

  it("a ratio just under the factor is not shown rounded up to it", () => {
    const at = { workload: "uniform" as const, concurrency: 4096 }
    const lines = render(
      reportOf({
        runs: [
          runOf({ ...at, target: "seed004" }),
          runOf({ ...at, target: "coord-sdk", measuredMs: 2000, cycles: 9_998 })
        ]
      })
    )
    const row = throughputRow(lines, "uniform at 4096: ≥ 5× seed004")
    expect(row[3]).toBe("4.99×")
    expect(row[4]).toBe("**not met**")
  })

  it.each([10, 1])("a goal at a concurrency not measured is not checked (coordinator at %d×)", (ratio) => {
    const at = { workload: "uniform" as const, concurrency: 256 }
    const lines = render(
      reportOf({
        levels: [16, 256],
        runs: [
          runOf({ ...at, target: "seed004" }),
          runOf({ ...at, target: "coord-sdk", cycles: ratio * 1000 })
        ]
      })
    )
    expect(verdictOf(lines, "uniform at 4096: ≥ 5× seed004")).toBe("not checked (measured at 256)")
    // The goal at 256 is at a level the run measured: checked.
    expect(verdictOf(lines, "uniform at 256: ≥ 2.5× seed004")).toBe(ratio >= 2.5 ? "**met**" : "**not met**")
  })

  it.each([
    { present: ["coord-sdk"], missing: "seed004" },
    { present: ["seed004"], missing: "coord-sdk" },
    { present: ["coord-sdk", "seed003"], missing: "seed004" }
  ])("without a $missing run the goal is not measured", ({ present, missing }) => {
    const lines = render(reportOf({ runs: present.map((target) => runOf({ target, cycles: 10_000 })) }))
    expect(throughputRow(lines, "uniform at 4096: ≥ 5× seed004").slice(1, 5)).toEqual([
      "n/a",
      "n/a",
      "n/a",
      `not measured (${missing} did not run uniform at 4096)`
    ])
  })

  // The coordinator sends 4 requests a cycle; the per-message echo answers 40,000 requests/s at 4096
  // in flight: 10,000 cycles/s. The baseline's cycles/s × 5 is the required value.
  it.each([
    { baselineCycles: 2001, above: true },
    { baselineCycles: 2000, above: false }
  ])("baseline $baselineCycles cycles/s: required above the per-message echo: $above", (input) => {
    const lines = render(
      reportOf({
        ceilingsMeasured: true,
        echo: [{ ...runOf({ target: "echo-message", requests: 40_000, cycles: 10_000 }), label: "echo" }],
        runs: [
          runOf({ target: "seed004", cycles: input.baselineCycles }),
          runOf({ cycles: 20_000, requests: 80_000 })
        ]
      })
    )
    expect(throughputRow(lines, "uniform at 4096: ≥ 5× seed004")[5]).toBe("n/a / 10,000")
    const notes = lines.filter((line) => line.startsWith("- uniform at 4096: ≥ 5× seed004: "))
    expect(notes).toHaveLength(1)
    const note = notes[0] ?? ""
    const perMessage = `The required ${(input.baselineCycles * 5).toLocaleString("en-US")} cycles/s is above the per-message NATS echo at 4096 in flight (10,000): no design sending one NATS request per command reaches it on this machine.`
    if (input.above) expect(note).toContain(perMessage)
    else {
      expect(note).not.toContain("no design sending one NATS request per command")
      expect(note).toContain("cycles/s is below every ceiling measured at 4096 in flight.")
    }
  })
})

describe("renderGoals: p99 at half of peak", () => {
  const refusals =
    "no verdict: most of the coordinator's reserves are refused and write nothing, where the durable echo writes every command"
  const lagging = "no verdict: the durable echo did not keep up (errors, drops or no drain)"
  const cases: ReadonlyArray<{
    name: string
    workload?: WorkloadKey
    coordinator?: Partial<OpenLoopResult>
    durable?: Partial<OpenLoopResult>
    verdict: string
  }> = [
    { name: "at exactly 2× the floor", verdict: "**met**" },
    { name: "just above 2× the floor", coordinator: { latency: latency(4.01) }, verdict: "**not met**" },
    { name: "on mix, within the floor", workload: "mix", verdict: "**met**" },
    {
      name: "within the floor with dropped arrivals",
      coordinator: { dropped: 5 },
      verdict: "**not met** (5 of 1000 arrivals dropped)"
    },
    { name: "within the floor with errors", coordinator: { errors: 3 }, verdict: "**not met** (3 errors)" },
    {
      name: "within the floor with over-grants",
      coordinator: { overGrants: 1 },
      verdict: "**not met** (1 over-grants)"
    },
    { name: "a durable echo with errors", durable: { errors: 1 }, verdict: lagging },
    { name: "a durable echo that dropped", durable: { dropped: 1 }, verdict: lagging },
    { name: "a durable echo not drained", durable: { drainedCleanly: false }, verdict: lagging },
    { name: "hot, within the floor", workload: "hot", verdict: refusals },
    {
      name: "hot, far above the floor with errors",
      workload: "hot",
      coordinator: { latency: latency(100), errors: 2 },
      durable: { errors: 1 },
      verdict: refusals
    }
  ]

  it.each(cases)("$name: $verdict", ({ workload = "uniform", coordinator, durable, verdict }) => {
    const run = openLoopOf({ workload, latency: latency(4), ...coordinator })
    // Another coordinator target on the same workload, its verdict "**met**": the row must be the right one.
    const other = openLoopOf({ target: "coord-msg", workload, latency: latency(1) })
    const floor = (
      of: OpenLoopResult,
      kind: FloorRun["floor"],
      p99Ms: number,
      more?: Partial<OpenLoopResult>
    ): FloorRun => ({
      floor: kind,
      coordinatorTarget: of.target,
      run: openLoopOf({ target: `${kind}-${of.target}`, workload, latency: latency(p99Ms), ...more })
    })
    const lines = render(
      reportOf({
        ceilingsMeasured: true,
        halfPeak: {
          fraction: 0.5,
          inFlightMax: 8192,
          workloads: [workload],
          runs: [run, other].map((half) => ({ peak: runOf({ target: half.target, workload }), run: half })),
          floors: [
            floor(run, "durable-echo", 2, durable),
            floor(run, "echo", 0.5),
            floor(other, "durable-echo", 2)
          ]
        }
      })
    )
    const row = cellsOf(lines, `| coord-sdk | ${workload} |`)
    expect(row.slice(3, 5)).toEqual([formatMs(run.latency.p99Ms), "2.00"])
    expect(row[6]).toBe(verdict)
    if (workload !== "hot") expect(cellsOf(lines, `| coord-msg | ${workload} |`)[6]).toBe("**met**")
  })
})

describe("renderGoals: issue 27, the coordinator against its floor", () => {
  const floorRow = (lines: ReadonlyArray<string>, workload: WorkloadKey, level: number) =>
    cellsOf(lines, `| ${workload} | ${level} |`)

  // The coordinator at 1,000 cycles/s: within 1.2× of the floor while the floor does at most 1,200.
  it.each([
    { floorCycles: 1200, verdict: "**met**", ratio: "1.20×" },
    { floorCycles: 1201, verdict: "**not met**", ratio: "1.20×" },
    { floorCycles: 3000, verdict: "**not met**", ratio: "3.00×" },
    { floorCycles: 800, verdict: "**met**", ratio: "0.80×" }
  ])("a floor at $floorCycles cycles/s: $verdict", ({ floorCycles, verdict, ratio }) => {
    const lines = render(
      reportOf({
        workloads: [{ key: "uniform" } as Report["workloads"][number]],
        runs: [runOf({}), runOf({ target: "floor", cycles: floorCycles })]
      })
    )
    expect(floorRow(lines, "uniform", 4096).slice(2, 6)).toEqual([
      "1,000",
      floorCycles.toLocaleString("en-US"),
      ratio,
      verdict
    ])
  })

  it.each([
    { trouble: { errors: 1 }, verdict: "**not met** (1 errors)" },
    { trouble: { overGrants: 2 }, verdict: "**not met** (2 over-grants)" },
    { trouble: { drainedCleanly: false }, verdict: "**not met** (did not drain)" }
  ])("a coordinator faster than its floor with $verdict", ({ trouble, verdict }) => {
    const lines = render(
      reportOf({
        workloads: [{ key: "uniform" } as Report["workloads"][number]],
        runs: [runOf({ cycles: 2000, ...trouble }), runOf({ target: "floor" })]
      })
    )
    expect(floorRow(lines, "uniform", 4096)[5]).toBe(verdict)
  })

  it("hot gets no verdict: the floor grants what the coordinator refuses", () => {
    const lines = render(
      reportOf({
        workloads: [{ key: "hot" } as Report["workloads"][number]],
        runs: [runOf({ workload: "hot", cycles: 10 }), runOf({ workload: "hot", target: "floor" })]
      })
    )
    expect(floorRow(lines, "hot", 4096)[5]).toMatch(/^no verdict: the floor grants/)
  })

  // 1,000 cycles in 1,000 ms: Postgres at 2% of a core is 20 µs a cycle; 500,000 WAL bytes 500 B.
  it.each([
    { postgres: 2, walBytes: 500_000, cpuVerdict: "**met**", walVerdict: "**met**" },
    { postgres: 2.1, walBytes: 501_000, cpuVerdict: "**not met**", walVerdict: "**not met**" }
  ])(
    "Postgres at $postgres% and $walBytes WAL bytes: CPU $cpuVerdict, WAL $walVerdict",
    ({ postgres, walBytes, cpuVerdict, walVerdict }) => {
      const coordinator = runOf({ cpu: { ...cpu, postgres }, walBytes })
      const floor = runOf({ target: "floor", cpu: { ...cpu, postgres: 1 }, walBytes: 100_000 })
      const lines = render(
        reportOf({
          workloads: [{ key: "uniform" } as Report["workloads"][number]],
          runs: [coordinator, floor]
        })
      )
      const row = floorRow(lines, "uniform", 4096)
      expect(row[6]).toBe(`${(postgres * 10).toFixed(1)} / 10.0`)
      expect(row[7]).toBe(`${(walBytes / 1000).toFixed(0)} / 100`)
      const sentence = (start: string) => lines.find((line) => line.startsWith(start)) ?? ""
      expect(sentence("- Postgres CPU per uniform cycle at 4096:")).toContain(
        `coordinator ${(postgres * 10).toFixed(0)} µs, ${cpuVerdict} (goal 20 µs); the floor 10 µs.`
      )
      expect(sentence("- WAL per uniform cycle at 4096:")).toContain(
        `coordinator ${(walBytes / 1000).toFixed(0)} B, ${walVerdict} (goal 500 B); the floor 100 B.`
      )
    }
  )

  it("without a floor run it says so", () => {
    const lines = render(
      reportOf({ workloads: [{ key: "uniform" } as Report["workloads"][number]], runs: [runOf({})] })
    )
    expect(lines).toContain(
      "Not measured: coord-sdk and floor did not both run a workload at one concurrency."
    )
  })
})
