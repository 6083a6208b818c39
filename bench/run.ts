/**
 * `npm run bench` (`tsx bench/run.ts`): the same workloads at the same concurrency against the
 * coordinator (through its SDK and one command per NATS message) and the seeds' designs rebuilt as
 * baselines (004: Postgres FOR UPDATE function; 003: Redis Lua; 000: check-then-insert without a lock),
 * with the NATS echo and bare Postgres insert ceilings measured in the same run. Writes
 * bench/results/<date>-<quick|full>.md and .svg; progress on stderr.
 *
 * Options: --quick (under a minute), --levels 1,16 (concurrency), --measure-ms N, --warmup-ms N,
 * --targets seed004,seed003,seed000,coord-msg,coord-sdk, --workloads uniform,hot,mix, --no-ceilings,
 * --out DIR (where to write the results; default bench/results).
 */
import type { ChildProcess } from "node:child_process"
import { spawn } from "node:child_process"
import { randomBytes } from "node:crypto"
import { mkdir, writeFile } from "node:fs/promises"
import os from "node:os"
import { dirname, join, relative } from "node:path"
import { fileURLToPath } from "node:url"
import { parseArgs } from "node:util"
import { connect } from "@nats-io/transport-node"
import type { InsertCeiling } from "./ceilings.js"
import { measureInsertCeiling } from "./ceilings.js"
import type { RunResult } from "./lib/driver.js"
import { runWorkload, sleep } from "./lib/driver.js"
import { formatCpu } from "./lib/cpu.js"
import { machineInfo } from "./lib/machine.js"
import { makeProgress } from "./lib/progress.js"
import type { Report, TargetInfo } from "./lib/report.js"
import { renderMarkdown, renderSvg } from "./lib/report.js"
import type { Workload } from "./lib/workloads.js"
import { hotWorkload, mixWorkload, uniformWorkload } from "./lib/workloads.js"
import type { CoordinatorProcess } from "./targets/coordinatorProcess.js"
import { missingCoordinatorFiles, startCoordinator } from "./targets/coordinatorProcess.js"
import { makeNatsTarget, natsUrl } from "./targets/natsTarget.js"
import { createDatabase, databaseUrl, makePool, serverUrl } from "./targets/pgCommon.js"
import { makeSeed000Target } from "./targets/seed000Postgres.js"
import { makeSeed003Target } from "./targets/seed003Redis.js"
import { makeSeed004Target } from "./targets/seed004Postgres.js"
import type { Target } from "./targets/Target.js"

const root = join(dirname(fileURLToPath(import.meta.url)), "..")
const coordinatorKeys = ["coord-sdk", "coord-msg"]
const allTargetKeys = ["coord-sdk", "coord-msg", "seed004", "seed003", "seed000"]

const { values: options } = parseArgs({
  options: {
    quick: { type: "boolean", default: false },
    levels: { type: "string" },
    "measure-ms": { type: "string" },
    "warmup-ms": { type: "string" },
    targets: { type: "string" },
    workloads: { type: "string" },
    "no-ceilings": { type: "boolean", default: false },
    out: { type: "string" }
  }
})

const mode: "quick" | "full" = options.quick ? "quick" : "full"
const listOption = (text: string | undefined) =>
  text
    ?.split(",")
    .map((item) => item.trim())
    .filter(Boolean)
const levels = (
  listOption(options.levels) ?? (options.quick ? ["16", "256"] : ["1", "16", "256", "4096"])
).map(Number)
const measureMs = Number(options["measure-ms"] ?? (options.quick ? 700 : 5_000))
const warmupMs = Number(options["warmup-ms"] ?? (options.quick ? 200 : 1_000))
const insertMeasureMs = options.quick ? 400 : 2_000
const wantedTargets = new Set(listOption(options.targets) ?? allTargetKeys)
const wantedWorkloads = new Set(listOption(options.workloads) ?? ["uniform", "hot", "mix"])
if (levels.some((level) => !Number.isInteger(level) || level < 1) || !(measureMs > 0) || !(warmupMs >= 0)) {
  process.stderr.write("bench: --levels must be positive integers, --measure-ms > 0, --warmup-ms >= 0\n")
  process.exit(2)
}

/** Children this process started, stopped on exit or Ctrl-C. */
const cleanups: Array<() => Promise<void>> = []
const cleanupAll = async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup().catch(() => undefined)
}
process.once("SIGINT", () => {
  process.stderr.write("\nbench: interrupted, stopping what it started\n")
  void cleanupAll().then(() => process.exit(130))
})

const serviceVersions = async (): Promise<ReadonlyArray<string>> => {
  const pool = makePool(serverUrl, 1)
  const services: Array<string> = []
  try {
    const row = (
      await pool.query<{ version: string; fsync: string; sync: string }>(
        "select version() as version, current_setting('fsync') as fsync, current_setting('synchronous_commit') as sync"
      )
    ).rows[0]
    services.push(
      `${row?.version.split(" on ")[0] ?? "PostgreSQL"} (fsync=${row?.fsync}, synchronous_commit=${row?.sync})`
    )
  } finally {
    await pool.end()
  }
  const nc = await connect({ servers: natsUrl, name: "bench-probe" })
  services.push(`nats-server ${nc.info?.version ?? "?"}`)
  await nc.close()
  return services
}

const startEcho = async (prefix: string): Promise<{ pid: number; stop: () => Promise<void> }> => {
  const child: ChildProcess = spawn(
    process.execPath,
    ["--import", "tsx", join("bench", "echoServer.ts"), prefix],
    {
      cwd: root,
      stdio: ["ignore", "pipe", "pipe"]
    }
  )
  const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()))
  await new Promise<void>((resolve, reject) => {
    let text = ""
    child.stdout?.on("data", (chunk: Buffer) => {
      text += chunk.toString()
      if (text.includes("ready")) resolve()
    })
    child.stderr?.on("data", (chunk: Buffer) => {
      text += chunk.toString()
    })
    void exited.then(() => reject(new Error(`echo server exited: ${text}`)))
  })
  return {
    pid: child.pid ?? -1,
    stop: async () => {
      child.kill("SIGTERM")
      await Promise.race([exited, sleep(5_000)])
    }
  }
}

const summaryOf = (run: RunResult) => {
  const cycles = (run.cycles * 1000) / run.measuredMs
  return `${run.target} ${run.workload} @${run.concurrency}: ${Math.round(cycles)} cycles/s, p99 ${run.latency.p99Ms.toFixed(1)} ms, errors ${run.errors}, over-grants ${run.overGrants}; cpu ${formatCpu(run.cpu, os.cpus().length)}`
}

const main = async () => {
  const startedAt = new Date()
  const namespace = randomBytes(3).toString("hex")
  const machine = machineInfo()
  const loadAverage = os.loadavg()
  const services = [...(await serviceVersions())]
  const infos: Array<TargetInfo> = []
  const targets: Array<Target> = []
  const remarks: Array<string> = []
  const log = (line: string) => process.stderr.write(`${line}\n`)

  const add = async (key: string, make: () => Promise<Target>) => {
    if (!wantedTargets.has(key)) return
    try {
      const target = await make()
      targets.push(target)
      infos.push({ key: target.key, label: target.label, durable: target.durable, notes: target.notes })
      cleanups.push(() => target.close())
    } catch (error) {
      log(`bench: target ${key} did not start: ${String(error)}`)
      infos.push({
        key,
        label: key,
        durable: true,
        notes: [],
        skipped: `did not start: ${String(error).slice(0, 300)}`
      })
    }
  }

  // The coordinator first: if it is not wired, say so, and measure the rest.
  const wantsCoordinator = coordinatorKeys.some((key) => wantedTargets.has(key))
  let coordinator: CoordinatorProcess | undefined
  if (wantsCoordinator) {
    const missing = missingCoordinatorFiles(root)
    if (missing.length > 0) {
      const reason = `not yet wired: ${missing.join(", ")} missing`
      for (const key of coordinatorKeys) {
        if (wantedTargets.has(key)) infos.push({ key, label: key, durable: true, notes: [], skipped: reason })
      }
    } else {
      log("bench: starting the coordinator (quota-coordinator serve)")
      try {
        coordinator = await startCoordinator(root)
        cleanups.push(() => coordinator!.stop())
      } catch (error) {
        const reason = `not yet wired: the coordinator did not start: ${String(error).slice(0, 400)}`
        for (const key of coordinatorKeys) {
          if (wantedTargets.has(key))
            infos.push({ key, label: key, durable: true, notes: [], skipped: reason })
        }
      }
    }
  }
  if (coordinator !== undefined) {
    const running = coordinator
    await add("coord-sdk", async () => {
      const { makeSdkTarget } = await import("./targets/sdkTarget.js")
      return makeSdkTarget(running.prefix, running.partitions)
    })
    await add("coord-msg", () =>
      makeNatsTarget({
        key: "coord-msg",
        label: "coordinator, one command per message",
        notes: ["Raw NATS request/reply, one JSON command per message, to the same coordinator process."],
        prefix: running.prefix,
        partitions: running.partitions,
        mode: "message",
        echo: false
      })
    )
  }
  const baselineDatabase = `bench_${namespace}`
  cleanups.push(await createDatabase(baselineDatabase))
  const baselineUrl = databaseUrl(baselineDatabase)
  await add("seed004", () => makeSeed004Target(baselineUrl))
  await add("seed003", () => makeSeed003Target(namespace))
  await add("seed000", () => makeSeed000Target(baselineUrl))
  services.push(
    "Redis (version and persistence in seed 003's note)",
    `coordinator: ${coordinator === undefined ? "not running" : `quota-coordinator serve, pid ${coordinator.pid}, prefix ${coordinator.prefix}, database ${coordinator.database}`}`
  )

  const workloads: Array<Workload> = [
    uniformWorkload(namespace),
    hotWorkload(),
    mixWorkload(namespace)
  ].filter((workload) => wantedWorkloads.has(workload.key))
  const ceilings = !options["no-ceilings"]
  const totalSteps =
    workloads.length * levels.length * targets.length + (ceilings ? 2 * levels.length + 1 : 0)
  const progress = makeProgress(totalSteps)
  const runs: Array<RunResult> = []
  let runIndex = 0

  for (const workload of workloads) {
    for (const target of targets) {
      progress.update(`priming ${target.key} for ${workload.key} (${workload.users.length} users)`, 0)
      await target.prime(workload.users, workload.meter)
    }
    for (const concurrency of levels) {
      for (const target of targets) {
        runIndex += 1
        const label = `${workload.key} @${concurrency} ${target.key}`
        const run = await runWorkload(
          target,
          {
            workload,
            concurrency,
            warmupMs,
            measureMs,
            runTag: `${namespace}r${runIndex}`,
            drainMsMax: 60_000,
            ...(coordinator === undefined ? {} : { server: { pid: coordinator.pid, label: "coord" } })
          },
          (fraction) => progress.update(label, fraction)
        )
        runs.push(run)
        progress.advance(summaryOf(run))
      }
    }
  }

  const echoRuns: Array<RunResult & { label: string }> = []
  let inserts: ReadonlyArray<InsertCeiling> = []
  if (ceilings) {
    const echoPrefix = `bench_echo_${namespace}`
    const echoServer = await startEcho(echoPrefix)
    cleanups.push(echoServer.stop)
    const echoWorkload = uniformWorkload(`${namespace}e`)
    for (const [mode, label] of [
      ["message", "NATS echo, one command per message"],
      ["coalesce", "NATS echo, batched (bench coalescer)"]
    ] as const) {
      const echo = await makeNatsTarget({
        key: `echo-${mode}`,
        label,
        notes: [],
        prefix: echoPrefix,
        partitions: coordinator?.partitions ?? 64,
        mode,
        echo: true
      })
      for (const concurrency of levels) {
        runIndex += 1
        const run = await runWorkload(
          echo,
          {
            workload: echoWorkload,
            concurrency,
            warmupMs,
            measureMs,
            runTag: `${namespace}r${runIndex}`,
            drainMsMax: 60_000,
            server: { pid: echoServer.pid, label: "echo" }
          },
          (fraction) => progress.update(`ceiling ${label} @${concurrency}`, fraction)
        )
        echoRuns.push({ ...run, label })
        progress.advance(summaryOf(run))
      }
      await echo.close()
    }
    inserts = await measureInsertCeiling(baselineUrl, levels, insertMeasureMs, (label, fraction) =>
      progress.update(label, Math.min(1, fraction / levels.length))
    )
    progress.advance(
      `postgres unnest insert: ${inserts.map((insert) => `${insert.batchRows} rows/commit ${Math.round(insert.rowsPerSecond)} rows/s`).join(", ")}`
    )
  }
  progress.done()
  await cleanupAll()

  remarks.push(...boundRemarks(runs, echoRuns, inserts, levels))
  const saturated = runs.filter((run) => coordinatorKeys.includes(run.target) && run.cpu.server >= 80)
  if (saturated.length > 0) {
    remarks.push(
      `The coordinator's process used 80% of a core or more (one Node.js thread: its bound) in: ${saturated
        .map((run) => `${run.target} ${run.workload} @${run.concurrency} (${Math.round(run.cpu.server)}%)`)
        .join(", ")}.`
    )
  }
  const busyNeighbours = [...runs, ...echoRuns].filter((run) => run.cpu.other > 50).length
  if (busyNeighbours > 0) {
    remarks.push(
      `In ${busyNeighbours} of ${runs.length + echoRuns.length} runs, processes the bench did not start (other jobs on this machine) used more than half a core while it measured (the *other* share): those numbers are lower, and noisier, than on a quiet machine.`
    )
  }
  const coordinatorOutput = coordinator?.output().trim() ?? ""
  if (coordinatorOutput !== "") {
    const lastLines = coordinatorOutput.split("\n").slice(-3).join(" / ").slice(0, 600)
    remarks.push(
      `The coordinator process wrote (last lines, LOG_LEVEL=warn): \`${lastLines.replace(/`/g, "'")}\``
    )
  }
  const report: Report = {
    mode,
    startedAt,
    finishedAt: new Date(),
    machine,
    services,
    loadAverage,
    levels,
    warmupMs,
    measureMs,
    workloads,
    targets: infos,
    coordinatorKeys,
    runs,
    echo: echoRuns,
    inserts,
    remarks
  }
  const directory = options.out ?? join(root, "bench", "results")
  await mkdir(directory, { recursive: true })
  const base = `${startedAt.toISOString().slice(0, 10)}-${mode}`
  await writeFile(join(directory, `${base}.svg`), renderSvg(report))
  const markdown = renderMarkdown(report, `${base}.svg`)
  await writeFile(join(directory, `${base}.md`), markdown)
  process.stdout.write(`${markdown}\n`)
  log(`bench: wrote ${relative(process.cwd(), join(directory, `${base}.md`))} and ${base}.svg`)
}

/** Sentences that put the coordinator's numbers next to the ceilings at the same concurrency. */
const boundRemarks = (
  runs: ReadonlyArray<RunResult>,
  echo: ReadonlyArray<RunResult & { label: string }>,
  inserts: ReadonlyArray<InsertCeiling>,
  levels: ReadonlyArray<number>
): Array<string> => {
  const remarks: Array<string> = []
  const rate = (run: RunResult) => (run.requests * 1000) / run.measuredMs
  for (const concurrency of levels) {
    const uniform = (key: string) =>
      runs.find((run) => run.target === key && run.workload === "uniform" && run.concurrency === concurrency)
    const echoOf = (label: string) =>
      echo.find((run) => run.concurrency === concurrency && run.label.includes(label))
    const pairs: ReadonlyArray<readonly [RunResult | undefined, RunResult | undefined, string]> = [
      [uniform("coord-msg"), echoOf("one command"), "one command per message"],
      [uniform("coord-sdk"), echoOf("batched"), "batched"]
    ]
    for (const [measured, ceiling, path] of pairs) {
      if (measured === undefined || ceiling === undefined || rate(ceiling) === 0) continue
      remarks.push(
        `uniform @${concurrency}, ${path}: the coordinator answered ${Math.round(rate(measured)).toLocaleString("en-US")} req/s (batch ${measured.meanBatch.toFixed(1)}), ${((100 * rate(measured)) / rate(ceiling)).toFixed(0)}% of the NATS echo's ${Math.round(rate(ceiling)).toLocaleString("en-US")} req/s (batch ${ceiling.meanBatch.toFixed(1)}).`
      )
    }
    const insert = inserts.find((candidate) => candidate.batchRows === concurrency)
    const sdk = uniform("coord-sdk")
    if (insert !== undefined && sdk !== undefined) {
      remarks.push(
        `uniform @${concurrency}: a bare unnest insert commits ${Math.round(insert.rowsPerSecond).toLocaleString("en-US")} rows/s at ${concurrency} rows per commit (${Math.round(insert.commitsPerSecond).toLocaleString("en-US")} commits/s); the coordinator decided ${Math.round(rate(sdk)).toLocaleString("en-US")} req/s through the SDK, each decision written before its reply.`
      )
    }
  }
  return remarks
}

main().then(
  () => process.exit(0),
  async (error: unknown) => {
    process.stderr.write(
      `\nbench: failed: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`
    )
    await cleanupAll()
    process.exit(1)
  }
)
