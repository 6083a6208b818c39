/**
 * `npm run bench:profile` (`tsx bench/profile.ts`): where the coordinator's CPU goes under load. Runs
 * the bench (bench/run.ts, as a child process) on one coordinator target, workload and concurrency with
 * the coordinator under `node --cpu-prof` (BENCH_COORDINATOR_NODE_FLAGS), its results in a temporary
 * directory so the committed ones stay. The coordinator writes its profile when the bench stops it
 * (SIGTERM: it drains and exits). Writes bench/results/<date>-profile.md (self time by category, the top
 * functions, what the numbers say) and <date>-profile-flame.svg; progress on stderr.
 *
 * The tables and the flame graph cover the measured window: the last `--measure-ms` before the bench
 * reported the run, found on the clock both processes share (V8's profile timestamps and
 * `process.hrtime` are the same monotonic microseconds). The category table also gives the whole
 * process life (start-up, priming, warm-up, drain).
 *
 * Options: --target coord-sdk|coord-msg (default coord-sdk), --workload uniform|hot-granted|hot|mix (uniform),
 * --level N (concurrency, 256), --measure-ms N (8000), --warmup-ms N (the bench's default),
 * --out DIR (default bench/results), --keep-profile (copy the main thread's .cpuprofile next to the
 * report, for Chrome's DevTools or speedscope).
 */
import { spawn } from "node:child_process"
import { copyFile, mkdir, mkdtemp, readdir, readFile, rm, stat, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { dirname, join, relative } from "node:path"
import { fileURLToPath, pathToFileURL } from "node:url"
import { parseArgs } from "node:util"
import type { CategoryTime, ProfileSummary, TimeWindow } from "./lib/cpuProfile.js"
import { mergedCallTree, nativeLocation, readCpuProfile, summarizeProfile } from "./lib/cpuProfile.js"
import { renderFlameGraph } from "./lib/flameGraph.js"
import { formatMs, formatRate } from "./lib/format.js"
import { machineInfo } from "./lib/machine.js"
import { isWorkloadKey, workloadKeys } from "./lib/workloads.js"

const root = join(dirname(fileURLToPath(import.meta.url)), "..")
const repositoryUrl = pathToFileURL(root).href
const targetKeys = ["coord-sdk", "coord-msg"]
const topFunctionCount = 25
const microsPerMs = 1000
const msPerSecond = 1000

const { values: options } = parseArgs({
  options: {
    target: { type: "string", default: "coord-sdk" },
    workload: { type: "string", default: "uniform" },
    level: { type: "string", default: "256" },
    "measure-ms": { type: "string", default: "8000" },
    "warmup-ms": { type: "string" },
    out: { type: "string" },
    "keep-profile": { type: "boolean", default: false }
  }
})
const level = Number(options.level)
const measureMs = Number(options["measure-ms"])
if (
  !targetKeys.includes(options.target) ||
  !isWorkloadKey(options.workload) ||
  !Number.isInteger(level) ||
  level < 1 ||
  !(measureMs > 0) ||
  (options["warmup-ms"] !== undefined && !(Number(options["warmup-ms"]) >= 0))
) {
  process.stderr.write(
    `bench:profile: --target ${targetKeys.join("|")}, --workload ${workloadKeys.join("|")}, --level a positive integer, --measure-ms > 0, --warmup-ms >= 0\n`
  )
  process.exit(2)
}

const log = (line: string) => process.stderr.write(`${line}\n`)
const percent = (value: number | undefined) => (value === undefined ? "—" : `${value.toFixed(1)}%`)
const formatPercentOf = (part: number, whole: number) => percent(whole > 0 ? (100 * part) / whole : 0)
const nowMicros = () => Number(process.hrtime.bigint() / 1000n)

/** The bench's arguments: one target, one workload, one level, no ceilings, no open loop. */
const benchArguments = (benchDirectory: string): Array<string> => [
  "--out",
  benchDirectory,
  "--targets",
  options.target,
  "--workloads",
  options.workload,
  "--levels",
  String(level),
  "--measure-ms",
  String(measureMs),
  ...(options["warmup-ms"] === undefined ? [] : ["--warmup-ms", options["warmup-ms"]]),
  "--no-ceilings",
  "--no-half-peak"
]

/**
 * Runs the bench with the coordinator profiled; resolves with when (hrtime microseconds) it printed
 * the run's summary line, the end of the measured window give or take the drain, if it did.
 */
const runBench = (args: ReadonlyArray<string>, profileDirectory: string): Promise<number | undefined> =>
  new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ["--import", "tsx", join("bench", "run.ts"), ...args], {
      cwd: root,
      env: {
        ...process.env,
        BENCH_COORDINATOR_NODE_FLAGS: `--cpu-prof --cpu-prof-dir=${profileDirectory}`
      },
      // The bench's own Markdown is read from its --out directory; its progress is passed on.
      stdio: ["ignore", "ignore", "pipe"]
    })
    // Not a terminal, the bench writes one line per run: `[1/1] coord-sdk uniform @256: ...`.
    const summaryLine = `] ${options.target} ${options.workload} @${level}:`
    let summaryAtMicros: number | undefined
    let pending = ""
    child.stderr.on("data", (chunk: Buffer) => {
      const at = nowMicros()
      process.stderr.write(chunk)
      pending += chunk.toString()
      const lines = pending.split("\n")
      pending = lines.pop() ?? ""
      if (summaryAtMicros === undefined && lines.some((line) => line.includes(summaryLine))) {
        summaryAtMicros = at
      }
    })
    child.once("error", reject)
    child.once("exit", (code, signal) =>
      code === 0
        ? resolve(summaryAtMicros)
        : reject(new Error(`bench/run.ts exited with ${code ?? signal ?? "?"}`))
    )
  })

/** The largest `.cpuprofile` in the directory: the main thread's (tsx's loader thread writes its own). */
const mainThreadProfile = async (directory: string): Promise<string> => {
  const files = (await readdir(directory)).filter((file) => file.endsWith(".cpuprofile"))
  const sized = await Promise.all(
    files.map(async (file) => ({ file, bytes: (await stat(join(directory, file))).size }))
  )
  const largest = sized.sort((left, right) => right.bytes - left.bytes)[0]
  if (largest === undefined) {
    throw new Error("the coordinator wrote no .cpuprofile (it writes one only when it exits on its own)")
  }
  return join(directory, largest.file)
}

/** The closed-loop table row of the bench's Markdown at `level`, cells by column header. */
const benchRow = (markdown: string, level: number): ReadonlyMap<string, string> | undefined => {
  const cellsOf = (line: string) =>
    line
      .split("|")
      .slice(1, -1)
      .map((cell) => cell.trim())
  const lines = markdown.split("\n")
  const headerIndex = lines.findIndex((line) => line.startsWith("| target | in flight | cycles/s | req/s |"))
  if (headerIndex < 0) return undefined
  const header = cellsOf(lines[headerIndex] ?? "")
  for (const line of lines.slice(headerIndex + 2)) {
    if (!line.startsWith("|")) break
    const cells = cellsOf(line)
    if (cells[1] === String(level)) return new Map(header.map((name, index) => [name, cells[index] ?? ""]))
  }
  return undefined
}

/** Categories by time, most first, idle last. */
const busyFirst = (entries: ReadonlyArray<CategoryTime>): ReadonlyArray<CategoryTime> => [
  ...entries.filter((entry) => entry.category !== "idle").sort((left, right) => right.ms - left.ms),
  ...entries.filter((entry) => entry.category === "idle")
]

const numberOf = (cell: string | undefined): number => Number((cell ?? "").replace(/,/g, ""))

const categoryTable = (
  measured: ProfileSummary,
  whole: ProfileSummary | undefined
): ReadonlyArray<string> => {
  const wholeOf = (category: CategoryTime["category"]) =>
    whole?.byCategory.find((entry) => entry.category === category)
  return [
    `| category | ms | % of non-idle${whole === undefined ? "" : " | whole process life, ms | % of non-idle"} |`,
    `| --- | --- | ---${whole === undefined ? "" : " | --- | ---"} |`,
    ...busyFirst(measured.byCategory).map((entry) => {
      const wholeEntry = wholeOf(entry.category)
      const wholeCells =
        wholeEntry === undefined ? "" : ` | ${formatMs(wholeEntry.ms)} | ${percent(wholeEntry.percentOfBusy)}`
      const row = `| ${entry.category} | ${formatMs(entry.ms)} | ${percent(entry.percentOfBusy)}${wholeCells} |`
      // The non-idle total goes between the busy categories and idle, the one not in it.
      return entry.category === "idle"
        ? `| **non-idle** | **${formatMs(measured.busyMs)}** | 100%${whole === undefined ? "" : ` | ${formatMs(whole.busyMs)} | 100%`} |\n${row}`
        : row
    })
  ]
}

/** Plain sentences from the numbers alone. */
const findings = (summary: ProfileSummary, requestsPerSecond: number | undefined): ReadonlyArray<string> => {
  const share = (category: CategoryTime["category"]) =>
    summary.byCategory.find((entry) => entry.category === category)?.percentOfBusy ?? 0
  const sentences: Array<string> = []
  sentences.push(
    `In the ${formatMs(summary.spanMs)} ms profiled, the coordinator's main thread was busy ${formatMs(summary.busyMs)} ms (${formatPercentOf(summary.busyMs, summary.spanMs)} of one core) and idle the rest.`
  )
  // Only over the measured window: the whole process life holds start-up, priming and the drain too.
  if (requestsPerSecond !== undefined && requestsPerSecond > 0) {
    const requests = (requestsPerSecond * summary.spanMs) / msPerSecond
    sentences.push(
      `That is ${formatRate((summary.busyMs * microsPerMs) / requests)} µs of main-thread CPU per request at the ${formatRate(requestsPerSecond)} req/s the bench measured with the profiler on.`
    )
  }
  const largest = busyFirst(summary.byCategory).slice(0, 3)
  sentences.push(
    `The largest categories are ${largest.map((entry) => `${entry.category} (${percent(entry.percentOfBusy)})`).join(", ")} of the non-idle time.`
  )
  const ownCode = share("actors") + share("domain")
  sentences.push(
    `Effect's runtime takes ${percent(share("effect runtime"))}, ${share("effect runtime") > ownCode ? "more" : "less"} than the actors' and domain code it runs (${percent(ownCode)}); garbage collection ${percent(share("gc"))}.`
  )
  sentences.push(
    `Socket writes take ${percent(share("socket writes"))}: on this VM that includes time the process is preempted while the kernel wakes the receiving process (NATS or Postgres), so it is an upper bound of the writes' own cost.`
  )
  // Native entries (the collector, socket writes, `(program)`) have their own sentences or rows.
  const top = summary.topFunctions.find((entry) => entry.location !== nativeLocation)
  if (top !== undefined) {
    const topShare = summary.topFunctions.reduce((sum, entry) => sum + entry.percentOfBusy, 0)
    sentences.push(
      `The JavaScript function with the most self time is \`${top.name}\` at \`${top.location}\` (${top.category}), ${percent(top.percentOfBusy)}; the top ${summary.topFunctions.length} entries of the table together hold ${percent(topShare)}.`
    )
  }
  return sentences
}

const main = async () => {
  const startedAt = new Date()
  const temporary = await mkdtemp(join(tmpdir(), "quota-profile-"))
  const profileDirectory = join(temporary, "cpuprofile")
  const benchDirectory = join(temporary, "bench")
  try {
    const args = benchArguments(benchDirectory)
    log(`bench:profile: bench/run.ts ${args.join(" ")}, the coordinator under --cpu-prof`)
    const summaryAtMicros = await runBench(args, profileDirectory)
    const profilePath = await mainThreadProfile(profileDirectory)
    const profile = await readCpuProfile(profilePath)
    const benchMarkdown = await readFile(
      join(benchDirectory, (await readdir(benchDirectory)).find((file) => file.endsWith(".md")) ?? ""),
      "utf8"
    )
    const row = benchRow(benchMarkdown, level)

    // The measured window when the summary line was seen and falls inside the profile.
    const candidate: TimeWindow | undefined =
      summaryAtMicros === undefined
        ? undefined
        : { fromMicros: summaryAtMicros - measureMs * microsPerMs, toMicros: summaryAtMicros }
    const window =
      candidate !== undefined &&
      candidate.fromMicros >= profile.startTime &&
      candidate.toMicros <= profile.endTime
        ? candidate
        : undefined
    const summaryOptions = { repositoryUrl, topCount: topFunctionCount }
    const whole = summarizeProfile(profile, summaryOptions)
    const measured = window === undefined ? whole : summarizeProfile(profile, { ...summaryOptions, window })

    const directory = options.out ?? join(root, "bench", "results")
    await mkdir(directory, { recursive: true })
    const base = `${startedAt.toISOString().slice(0, 10)}-profile`
    const svgName = `${base}-flame.svg`
    const runLabel = `${options.target}, ${options.workload}, ${level} in flight`
    const spanText =
      window === undefined
        ? "the whole process life (the bench's summary line was not seen inside the profile)"
        : `the last ${measureMs} ms before the bench reported the run: its measured window, give or take the drain of the cycles in flight`
    const tree = mergedCallTree(profile, window)
    await writeFile(
      join(directory, svgName),
      renderFlameGraph(tree, {
        title: `quota-coordinator CPU: ${runLabel}`,
        subtitle: `${startedAt.toISOString().slice(0, 16).replace("T", " ")} UTC · main thread, ${window === undefined ? "whole process life" : `measured window (${measureMs} ms)`} · ${formatMs(tree.totalMicros / microsPerMs)} ms of ${formatMs(measured.spanMs)} ms drawn: idle and (program) left out`,
        repositoryUrl
      })
    )

    const machine = machineInfo()
    const commandArguments = process.argv.slice(2).join(" ")
    const cell = (name: string) => row?.get(name) ?? "?"
    const requestsPerSecond = numberOf(row?.get("req/s"))
    const markdown = [
      `# quota-coordinator CPU profile, ${startedAt.toISOString().slice(0, 16).replace("T", " ")} UTC`,
      "",
      `Machine: ${machine.cpuModel}, ${machine.cores} cores, ${machine.memoryGiB} GiB, Node ${machine.node}, ${machine.platform}. Code: ${machine.code}.`,
      "",
      `Command: \`npm run bench:profile${commandArguments === "" ? "" : ` -- ${commandArguments}`}\`: the bench (\`bench/run.ts ${benchArguments("<temporary>").join(" ")}\`) with the coordinator started under \`node --cpu-prof\` (\`BENCH_COORDINATOR_NODE_FLAGS\`).`,
      "",
      row === undefined
        ? "The bench's Markdown had no row for this run: its numbers are missing here."
        : `The run, as the bench measured it with the profiler on (${runLabel}): ${cell("cycles/s")} cycles/s, ${cell("req/s")} req/s, p50 ${cell("p50")} ms, p99 ${cell("p99")} ms, batch ${cell("batch")}, errors ${cell("errors")}; CPU % while measured: ${cell("CPU % while measured")}.`,
      "",
      `Profiled: the coordinator's main thread over ${spanText}; ${measured.sampleCount.toLocaleString("en-US")} samples (the largest of the process's \`.cpuprofile\` files; the others are its worker threads, left out)${options["keep-profile"] ? `, kept as \`${base}.cpuprofile\` for Chrome's DevTools or speedscope` : ""}.`,
      "",
      `![flame graph of the coordinator's main thread](${svgName})`,
      "",
      `[Flame graph](${svgName}): width is inclusive time, one row per call depth, the whole busy time on top; hover a frame for its file, time and share.`,
      "",
      "## Self time by category",
      "",
      ...categoryTable(measured, window === undefined ? undefined : whole),
      "",
      "A sample counts for the category of its nearest frame, itself or a caller, that has one: src/transport and @nats-io are *transport*; src/store and pg (pg-protocol, pg-pool, …) *store*; src/actors, src/domain, src/cluster their own; Effect's own files *effect runtime*; Node's module loaders and tsx *module loading* (start-up); Node.js internals and native calls count for their caller. " +
        `*Socket writes* are the native \`writev\`/\`writeBuffer\` of a socket: on this VM they include the time the process is preempted while the kernel wakes the receiving process, so they are an upper bound of the writes' cost. *Other* includes ${formatMs(measured.programMs)} ms of \`(program)\`: native time V8 attributes to no JavaScript function.`,
      "",
      `## Top ${topFunctionCount} functions by self time`,
      "",
      "| # | function | file:line:column | category | self ms | % of non-idle |",
      "| --- | --- | --- | --- | --- | --- |",
      ...measured.topFunctions.map(
        (entry, index) =>
          `| ${index + 1} | \`${entry.name}\` | \`${entry.location}\` | ${entry.category} | ${formatMs(entry.ms)} | ${percent(entry.percentOfBusy)} |`
      ),
      "",
      "Positions are V8's, 0-based, of the code as it ran. The coordinator runs under tsx, which compiles each .ts file to one long line (more only where a template literal spans lines): for src/ files the line is 0 or close to it and the column an offset into tsx's output, not into the source. Package and Node.js files are positioned in their own text.",
      "",
      "## What the numbers say",
      "",
      ...findings(measured, window === undefined ? undefined : requestsPerSecond).map(
        (sentence) => `- ${sentence}`
      ),
      ""
    ].join("\n")
    await writeFile(join(directory, `${base}.md`), markdown)
    if (options["keep-profile"]) await copyFile(profilePath, join(directory, `${base}.cpuprofile`))
    process.stdout.write(`${markdown}\n`)
    log(`bench:profile: wrote ${relative(process.cwd(), join(directory, `${base}.md`))} and ${svgName}`)
  } finally {
    await rm(temporary, { recursive: true, force: true })
  }
}

main().then(
  () => process.exit(0),
  (error: unknown) => {
    process.stderr.write(
      `\nbench:profile: failed: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`
    )
    process.exit(1)
  }
)
