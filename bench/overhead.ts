/**
 * `npm run bench:overhead -- --variant QUOTA_HTTP_ADDR=off`: what a setting costs, as a ratio measured
 * in one run. Two coordinators are started side by side (each its own database and prefix): A as
 * deployed (metrics on, its /metrics scraped every `--scrape-ms`, harsher than Prometheus's usual 15 s)
 * and B with the variant's settings. The same workload at the same concurrency then runs against A
 * and B in turn, A B A B ..., `--rounds` pairs, so drift of this shared machine hits both alike; the
 * ratio B/A is taken pair by pair and its median reported. Writes
 * bench/results/<date>-overhead-<name>.md.
 *
 * Options: --variant K=V[,K=V] (required), --name (file name; default from the variant), --workload
 * uniform|hot-granted|hot|mix (default uniform), --concurrency N (default 4096), --rounds N (default 5),
 * --measure-ms N (default 5000), --warmup-ms N (default 1000), --scrape-ms N (default 5000; 0: none).
 */
import { writeFile } from "node:fs/promises"
import net from "node:net"
import os from "node:os"
import { dirname, join } from "node:path"
import { fileURLToPath } from "node:url"
import { parseArgs } from "node:util"
import { runWorkload } from "./lib/driver.js"
import { formatCpu } from "./lib/cpu.js"
import { machineInfo } from "./lib/machine.js"
import type { RunResult } from "./lib/results.js"
import { cyclesPerSecond } from "./lib/results.js"
import type { WorkloadKey } from "./lib/workloads.js"
import { isWorkloadKey, makeWorkload, workloadKeys } from "./lib/workloads.js"
import type { CoordinatorProcess } from "./targets/coordinatorProcess.js"
import { startCoordinator } from "./targets/coordinatorProcess.js"
import { makeSdkTarget } from "./targets/sdkTarget.js"
import type { Target } from "./targets/Target.js"

const root = join(dirname(fileURLToPath(import.meta.url)), "..")

const { values: options } = parseArgs({
  options: {
    variant: { type: "string" },
    name: { type: "string" },
    workload: { type: "string", default: "uniform" },
    concurrency: { type: "string", default: "4096" },
    rounds: { type: "string", default: "5" },
    "measure-ms": { type: "string", default: "5000" },
    "warmup-ms": { type: "string", default: "1000" },
    "scrape-ms": { type: "string", default: "5000" }
  }
})

const variant = Object.fromEntries(
  (options.variant ?? "")
    .split(",")
    .filter((pair) => pair.includes("="))
    .map((pair) => [pair.slice(0, pair.indexOf("=")).trim(), pair.slice(pair.indexOf("=") + 1).trim()])
)
const concurrency = Number(options.concurrency)
const rounds = Number(options.rounds)
const measureMs = Number(options["measure-ms"])
const warmupMs = Number(options["warmup-ms"])
const scrapeMs = Number(options["scrape-ms"])
if (
  Object.keys(variant).length === 0 ||
  !Number.isInteger(concurrency) ||
  concurrency < 1 ||
  !Number.isInteger(rounds) ||
  rounds < 1 ||
  !(measureMs > 0) ||
  !(warmupMs >= 0) ||
  !(scrapeMs >= 0) ||
  !isWorkloadKey(options.workload)
) {
  process.stderr.write(
    `bench:overhead: --variant K=V[,K=V] is required; --concurrency, --rounds positive integers; --workload ${workloadKeys.join("|")}\n`
  )
  process.exit(2)
}
const name =
  options.name ??
  Object.entries(variant)
    .map(([key, value]) => `${key}-${value}`)
    .join("-")
    .toLowerCase()
    .replace(/[^a-z0-9-]+/g, "-")

const freePort = (): Promise<number> =>
  new Promise((resolve, reject) => {
    const server = net.createServer()
    server.once("error", reject)
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address() as net.AddressInfo
      server.close(() => resolve(port))
    })
  })

const log = (line: string) => process.stderr.write(`${line}\n`)

interface Side {
  readonly label: string
  readonly settings: Readonly<Record<string, string>>
  readonly coordinator: CoordinatorProcess
  readonly target: Target
  readonly metricsPort: number | undefined
  readonly runs: Array<RunResult>
}

const startSide = async (label: string, settings: Record<string, string>): Promise<Side> => {
  const coordinator = await startCoordinator(root, settings)
  const target = await makeSdkTarget(coordinator.prefix, coordinator.partitions)
  const address = settings["QUOTA_HTTP_ADDR"]
  const port = address === undefined || address === "off" ? undefined : Number(address.split(":").pop())
  return { label, settings, coordinator, target, metricsPort: port, runs: [] }
}

/** Scrapes /metrics every scrapeMs while `run` lasts, as a Prometheus would; returns how many scrapes. */
const whileScraping = async <A>(
  side: Side,
  run: () => Promise<A>
): Promise<{ value: A; scrapes: number }> => {
  let scrapes = 0
  const timer =
    side.metricsPort === undefined || scrapeMs === 0
      ? undefined
      : setInterval(() => {
          void fetch(`http://127.0.0.1:${side.metricsPort}/metrics`).then(
            async (response) => {
              await response.text()
              scrapes += 1
            },
            () => undefined
          )
        }, scrapeMs)
  try {
    return { value: await run(), scrapes }
  } finally {
    if (timer !== undefined) clearInterval(timer)
  }
}

const median = (values: ReadonlyArray<number>): number => {
  const sorted = [...values].sort((left, right) => left - right)
  const middle = Math.floor(sorted.length / 2)
  return sorted.length % 2 === 1 ? sorted[middle]! : (sorted[middle - 1]! + sorted[middle]!) / 2
}

const main = async () => {
  const namespace = `ovh${Date.now().toString(36)}`
  const workload = makeWorkload(options.workload as WorkloadKey, namespace)
  log(`bench:overhead: starting A (as deployed) and B (${JSON.stringify(variant)})`)
  const sides = [
    await startSide("A: as deployed", { QUOTA_HTTP_ADDR: `127.0.0.1:${await freePort()}` }),
    await startSide("B: variant", variant)
  ]
  const scrapesOf: Array<number> = [0, 0]
  try {
    for (const side of sides) await side.target.prime(workload.users, workload.meter)
    for (let round = 0; round < rounds; round += 1) {
      // A B, then B A: a side that always ran second would carry the first one's after-effects.
      const order = round % 2 === 0 ? [0, 1] : [1, 0]
      for (const index of order) {
        const side = sides[index]!
        const { value: run, scrapes } = await whileScraping(side, () =>
          runWorkload(
            side.target,
            {
              workload,
              warmupMs,
              measureMs,
              concurrency,
              runTag: `${namespace}r${round}s${index}`,
              drainMsMax: 60_000,
              server: { pids: [side.coordinator.pid], label: "coord" }
            },
            () => {}
          )
        )
        scrapesOf[index]! += scrapes
        side.runs.push(run)
        log(
          `round ${round + 1}/${rounds} ${side.label}: ${Math.round(cyclesPerSecond(run))} cycles/s, p99 ${run.latency.p99Ms.toFixed(1)} ms, errors ${run.errors}, cpu ${formatCpu(run.cpu, os.cpus().length)}`
        )
      }
    }
  } finally {
    for (const side of sides) {
      await side.target.close().catch(() => undefined)
      await side.coordinator.stop().catch(() => undefined)
    }
  }

  const [a, b] = sides as [Side, Side]
  const ratios = a.runs.map((run, index) => cyclesPerSecond(b.runs[index]!) / cyclesPerSecond(run))
  /** The coordinator's CPU per 1 000 cycles (ms): what the setting costs the process itself. */
  const cpuPerCycles = (run: RunResult): number => (run.cpu.server * 10 * 1_000) / cyclesPerSecond(run)
  const cpuRatios = a.runs.map((run, index) => cpuPerCycles(run) / cpuPerCycles(b.runs[index]!))
  const medianA = median(a.runs.map(cyclesPerSecond))
  const medianB = median(b.runs.map(cyclesPerSecond))
  const medianRatio = median(ratios)
  const date = new Date().toISOString().slice(0, 10)
  const machine = machineInfo()
  const lines = [
    `# Overhead: ${Object.entries(variant)
      .map(([key, value]) => `${key}=${value}`)
      .join(", ")} against the coordinator as deployed`,
    "",
    `${date}, ${machine.code}; ${machine.cpuModel}, ${machine.cores} cores, Node ${machine.node}.`,
    "",
    `Workload ${workload.key} at ${concurrency} in flight through the SDK, ${rounds} rounds (A then B, then B then A, in turn), ` +
      `${warmupMs} ms warm-up and ${measureMs} ms measured each. A: the coordinator as deployed ` +
      `(metrics on${scrapeMs > 0 ? `, /metrics scraped every ${scrapeMs} ms: ${scrapesOf[0]} scrapes` : ""}). ` +
      `B: ${JSON.stringify(variant)}. Each side its own coordinator process and database, idle while the other runs.`,
    "",
    "| round | A cycles/s | B cycles/s | B / A | A coordinator CPU ms per 1 000 cycles | B | A / B | A p99 ms | B p99 ms | A errors | B errors |",
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ...a.runs.map((run, index) => {
      const other = b.runs[index]!
      return `| ${index + 1} | ${Math.round(cyclesPerSecond(run))} | ${Math.round(cyclesPerSecond(other))} | ${ratios[index]!.toFixed(3)} | ${cpuPerCycles(run).toFixed(1)} | ${cpuPerCycles(other).toFixed(1)} | ${cpuRatios[index]!.toFixed(3)} | ${run.latency.p99Ms.toFixed(1)} | ${other.latency.p99Ms.toFixed(1)} | ${run.errors} | ${other.errors} |`
    }),
    "",
    `Median A ${Math.round(medianA)} cycles/s, median B ${Math.round(medianB)} cycles/s; median of the pairwise ratios B / A: **${medianRatio.toFixed(3)}** ` +
      `(by it A, as deployed, is ${Math.abs((medianRatio - 1) * 100).toFixed(1)} % ${medianRatio >= 1 ? "slower" : "faster"} than B; ` +
      `pairwise ratios from ${Math.min(...ratios).toFixed(3)} to ${Math.max(...ratios).toFixed(3)}). ` +
      `The coordinator's own CPU per cycle, A / B, median of the pairs: **${median(cpuRatios).toFixed(3)}** ` +
      `(from ${Math.min(...cpuRatios).toFixed(3)} to ${Math.max(...cpuRatios).toFixed(3)}).`,
    ""
  ]
  const path = join(root, "bench", "results", `${date}-overhead-${name}.md`)
  await writeFile(path, lines.join("\n"))
  process.stdout.write(`${lines.join("\n")}\nwritten to ${path}\n`)
}

main().then(
  () => process.exit(0),
  (error: unknown) => {
    process.stderr.write(
      `bench:overhead: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`
    )
    process.exit(1)
  }
)
