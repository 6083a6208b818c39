/**
 * `npm run bench` (`tsx bench/run.ts`): the same workloads at the same concurrency against the
 * coordinator (through its SDK and one command per NATS message) and the seeds' designs rebuilt as
 * baselines (004: Postgres FOR UPDATE function; 003: Redis Lua; 000: check-then-insert without a lock),
 * and issue 27's floor (floorServer.ts: the coordinator's path without the decision, through the same
 * SDK), with the NATS echo and bare Postgres insert ceilings measured in the same run. Writes
 * bench/results/<date>-<quick|full>.md and .svg; progress on stderr.
 *
 * After the closed-loop levels of a workload, the coordinator's targets and seeds 004 and 003 are
 * offered half of their closed-loop peak in an open loop (lib/openLoop.ts): the issue's "p99 at half of
 * peak" measured at a rate, not at a concurrency.
 *
 * Options: --quick (about a minute), --levels 1,16 (concurrency), --measure-ms N, --warmup-ms N,
 * --targets seed004,seed003,seed000,coord-msg,coord-sdk,floor, --workloads uniform,hot-granted,hot,mix,
 * --no-ceilings, --no-half-peak, --half-peak-workloads (default: all; --quick: uniform),
 * --out DIR (where to write the results; default bench/results), --baseline-root DIR (another checkout,
 * built and with its node_modules: its coordinator runs beside this one as target `coord-base`, so a
 * change is measured against the code before it in the same run).
 */
import { execFileSync } from "node:child_process"
import { randomBytes } from "node:crypto"
import { mkdir, writeFile } from "node:fs/promises"
import os from "node:os"
import { dirname, join, relative } from "node:path"
import { fileURLToPath } from "node:url"
import { parseArgs } from "node:util"
import { connect } from "@nats-io/transport-node"
import { measureInsertCeiling } from "./ceilings.js"
import { measureFloors } from "./floors.js"
import type { SessionPlan } from "./lib/driver.js"
import { runWorkload } from "./lib/driver.js"
import type { ServerProcesses } from "./lib/cpu.js"
import { formatCpu } from "./lib/cpu.js"
import { floorTarget } from "./lib/goals.js"
import { machineInfo } from "./lib/machine.js"
import { runAtRate } from "./lib/openLoop.js"
import { makeProgress } from "./lib/progress.js"
import { renderMarkdown, renderSvg } from "./lib/report.js"
import type { FloorRun, HalfPeakRun, InsertCeiling, Report, RunResult, TargetInfo } from "./lib/results.js"
import { bestRun, cyclesPerSecond } from "./lib/results.js"
import { makeWalMeter } from "./lib/wal.js"
import type { Workload } from "./lib/workloads.js"
import { isWorkloadKey, makeWorkload, workloadKeys } from "./lib/workloads.js"
import type { CoordinatorProcess } from "./targets/coordinatorProcess.js"
import { startCoordinator } from "./targets/coordinatorProcess.js"
import { startEchoProcess } from "./targets/echoProcess.js"
import type { FloorProcess } from "./targets/floorProcess.js"
import { startFloor } from "./targets/floorProcess.js"
import { makeNatsTarget, natsUrl } from "./targets/natsTarget.js"
import { createDatabase, databaseUrl, makePool, serverUrl } from "./targets/pgCommon.js"
import { makeSeed000Target } from "./targets/seed000Postgres.js"
import { makeSeed003Target } from "./targets/seed003Redis.js"
import { makeSeed004Target } from "./targets/seed004Postgres.js"
import type { Target } from "./targets/Target.js"

const root = join(dirname(fileURLToPath(import.meta.url)), "..")
const coordinatorKeys = ["coord-sdk", "coord-msg"]
/** `--baseline-root`'s coordinator: not in the default targets (it needs the option). */
const baselineTarget = "coord-base"
const allTargetKeys = ["coord-sdk", "coord-msg", floorTarget, "seed004", "seed003", "seed000"]
/** Open-loop phase: the coordinator's targets, and the two designs it is measured against for context. */
const halfPeakTargetKeys = [...coordinatorKeys, "seed004", "seed003"]
/** Open-loop phase: offered rate ÷ the target's closed-loop peak (the issue's "half of peak"). */
const halfPeakFraction = 0.5
/** Open-loop phase: cycles in flight at most; an arrival beyond is dropped and counted. */
const halfPeakInFlightMax = 8192

const { values: options } = parseArgs({
  options: {
    quick: { type: "boolean", default: false },
    levels: { type: "string" },
    "measure-ms": { type: "string" },
    "warmup-ms": { type: "string" },
    targets: { type: "string" },
    workloads: { type: "string" },
    "no-ceilings": { type: "boolean", default: false },
    "no-half-peak": { type: "boolean", default: false },
    "half-peak-workloads": { type: "string" },
    out: { type: "string" },
    "baseline-root": { type: "string" }
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
const wantedWorkloads = listOption(options.workloads) ?? workloadKeys
// Quick mode offers half of peak on uniform only, to stay near a minute; a full run on all of them.
const halfPeakWorkloads = new Set(
  listOption(options["half-peak-workloads"]) ?? (options.quick ? ["uniform"] : workloadKeys)
)
const halfPeak = !options["no-half-peak"]
if (
  levels.some((level) => !Number.isInteger(level) || level < 1) ||
  !(measureMs > 0) ||
  !(warmupMs >= 0) ||
  ![...wantedWorkloads, ...halfPeakWorkloads].every(isWorkloadKey)
) {
  process.stderr.write(
    `bench: --levels must be positive integers, --measure-ms > 0, --warmup-ms >= 0, --workloads and --half-peak-workloads among ${workloadKeys.join(",")}\n`
  )
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

const summaryOf = (run: RunResult) =>
  `${run.target} ${run.workload} @${run.concurrency}: ${Math.round(cyclesPerSecond(run))} cycles/s, p99 ${run.latency.p99Ms.toFixed(1)} ms, refused ${run.refused}, errors ${run.errors}, over-grants ${run.overGrants}; cpu ${formatCpu(run.cpu, os.cpus().length)}`

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

  // The coordinator first: if it does not start, say so, and measure the rest.
  let coordinator: CoordinatorProcess | undefined
  if (coordinatorKeys.some((key) => wantedTargets.has(key))) {
    log("bench: starting the coordinator (quota-coordinator serve)")
    try {
      coordinator = await startCoordinator(root)
      cleanups.push(coordinator.stop)
    } catch (error) {
      const skipped = `the coordinator did not start: ${String(error).slice(0, 400)}`
      for (const key of coordinatorKeys.filter((key) => wantedTargets.has(key)))
        infos.push({ key, label: key, durable: true, notes: [], skipped })
    }
  }
  // Another checkout's coordinator (the code before a change), its own process and database.
  let baseline: CoordinatorProcess | undefined
  const baselineRoot = options["baseline-root"]
  await add(baselineTarget, async () => {
    if (baselineRoot === undefined) throw new Error("--baseline-root DIR names the checkout to run")
    const started = await startCoordinator(baselineRoot)
    cleanups.push(started.stop)
    baseline = started
    const commit = execFileSync("git", ["-C", baselineRoot, "rev-parse", "--short", "HEAD"]).toString().trim()
    const { makeSdkTarget } = await import("./targets/sdkTarget.js")
    return makeSdkTarget(started.prefix, started.partitions, {
      key: baselineTarget,
      label: `coordinator at ${commit}, SDK (batched)`,
      server: `The coordinator of the checkout at ${baselineRoot} (commit ${commit}), run as this one is, in its own process on its own database: the code a change is measured against, in the same run.`
    })
  })
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
  let floor: FloorProcess | undefined
  await add(floorTarget, async () => {
    const started = await startFloor(root, namespace, coordinator?.partitions ?? 64)
    cleanups.push(started.stop)
    floor = started
    const { makeSdkTarget } = await import("./targets/sdkTarget.js")
    return makeSdkTarget(started.prefix, started.partitions, {
      key: floorTarget,
      label: "floor: decode, append, reply (SDK, batched)",
      server:
        "Issue 27's floor (bench/floorServer.ts), in its own process on its own database: the coordinator's NATS edge (subjects, queue group, decoding, replies), its group commit, per group one pipelined transaction of the coordinator's epoch fence and one appended row per partition touched (the commands as bytea); every command answered with its op's success status, decided by nothing (no limits: in hot it grants what the coordinator refuses)."
    })
  })
  const baselineDatabase = `bench_${namespace}`
  cleanups.push(await createDatabase(baselineDatabase))
  const baselineUrl = databaseUrl(baselineDatabase)
  await add("seed004", () => makeSeed004Target(baselineUrl))
  await add("seed003", () => makeSeed003Target(namespace))
  await add("seed000", () => makeSeed000Target(baselineUrl))
  services.push(
    "Redis (version and persistence in seed 003's note)",
    `coordinator: ${coordinator === undefined ? "not running" : `quota-coordinator serve, pid ${coordinator.pid}, prefix ${coordinator.prefix}, database ${coordinator.database}`}`,
    `floor: ${floor === undefined ? "not running" : `bench/floorServer.ts, pid ${floor.pid}, prefix ${floor.prefix}, database ${floor.database}`}`,
    ...(baseline === undefined
      ? []
      : [
          `baseline: quota-coordinator serve of ${baselineRoot}, pid ${baseline.pid}, prefix ${baseline.prefix}, database ${baseline.database}`
        ])
  )

  const workloads: Array<Workload> = workloadKeys
    .filter((key) => wantedWorkloads.includes(key))
    .map((key) => makeWorkload(key, namespace))
  const ceilings = !options["no-ceilings"]
  const halfPeakTargets = halfPeak ? targets.filter((target) => halfPeakTargetKeys.includes(target.key)) : []
  const halfPeakWorkloadCount = workloads.filter((workload) => halfPeakWorkloads.has(workload.key)).length
  const halfPeakSteps = halfPeakWorkloadCount * halfPeakTargets.length
  const coordinatorHalfPeakSteps =
    halfPeakWorkloadCount * halfPeakTargets.filter((target) => coordinatorKeys.includes(target.key)).length
  const totalSteps =
    workloads.length * levels.length * targets.length +
    halfPeakSteps +
    (ceilings ? 2 * levels.length + 1 + 2 * coordinatorHalfPeakSteps : 0)
  const progress = makeProgress(totalSteps)
  const runs: Array<RunResult> = []
  const halfPeakRuns: Array<HalfPeakRun> = []
  let runIndex = 0
  const coordinatorServer =
    coordinator === undefined ? undefined : { pids: [coordinator.pid], label: "coord" }
  const floorServer: ServerProcesses | undefined =
    floor === undefined ? undefined : { pids: [floor.pid], label: "floor" }
  const baselineServer: ServerProcesses | undefined =
    baseline === undefined ? undefined : { pids: [baseline.pid], label: "coord" }
  /** The process whose CPU a target's run reports apart: the floor's, the baseline's, else the coordinator's. */
  const serverOf = (target: Target) =>
    target.key === floorTarget
      ? floorServer
      : target.key === baselineTarget
        ? baselineServer
        : coordinatorServer
  // One connection reads the server's WAL position around every measured window.
  const walPool = makePool(serverUrl, 1)
  cleanups.push(() => walPool.end())
  const wal = makeWalMeter(walPool)
  /** What every run of the bench shares; each gets its own tag. */
  const sessionPlan = (workload: Workload, server: SessionPlan["server"]): SessionPlan => {
    runIndex += 1
    return {
      workload,
      warmupMs,
      measureMs,
      runTag: `${namespace}r${runIndex}`,
      drainMsMax: 60_000,
      wal,
      ...(server === undefined ? {} : { server })
    }
  }

  for (const workload of workloads) {
    for (const target of targets) {
      progress.update(`priming ${target.key} for ${workload.key} (${workload.users.length} users)`, 0)
      await target.prime(workload.users, workload.meter)
    }
    for (const concurrency of levels) {
      for (const target of targets) {
        const label = `${workload.key} @${concurrency} ${target.key}`
        const run = await runWorkload(
          target,
          { ...sessionPlan(workload, serverOf(target)), concurrency },
          (fraction) => progress.update(label, fraction)
        )
        runs.push(run)
        progress.advance(summaryOf(run))
      }
    }
    if (!halfPeakWorkloads.has(workload.key)) continue
    // The same primed state, each target at half the most it did in the closed loop just measured.
    for (const target of halfPeakTargets) {
      const peak = bestRun(runs.filter((run) => run.target === target.key && run.workload === workload.key))
      if (peak === undefined || cyclesPerSecond(peak) <= 0) {
        progress.advance(`${workload.key} half of peak ${target.key}: no closed-loop peak to halve, skipped`)
        continue
      }
      const rate = halfPeakFraction * cyclesPerSecond(peak)
      const label = `${workload.key} open loop ${Math.round(rate)}/s ${target.key}`
      const run = await runAtRate(
        target,
        {
          ...sessionPlan(workload, serverOf(target)),
          cyclesPerSecond: rate,
          inFlightMax: halfPeakInFlightMax
        },
        (fraction) => progress.update(label, fraction)
      )
      halfPeakRuns.push({ peak, run })
      progress.advance(
        `${summaryOf(run)}; open loop at ${Math.round(rate)}/s offered, dropped ${run.dropped}, most in flight ${run.concurrency}`
      )
    }
  }

  const echoRuns: Array<RunResult & { label: string }> = []
  let inserts: ReadonlyArray<InsertCeiling> = []
  let floors: ReadonlyArray<FloorRun> = []
  if (ceilings) {
    const echoPrefix = `bench_echo_${namespace}`
    const echoServer = await startEchoProcess(root, "echoServer.ts", [echoPrefix])
    cleanups.push(echoServer.stop)
    const echoWorkload = makeWorkload("uniform", `${namespace}e`)
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
        const run = await runWorkload(
          echo,
          { ...sessionPlan(echoWorkload, { pids: [echoServer.pid], label: "echo" }), concurrency },
          (fraction) => progress.update(`ceiling ${label} @${concurrency}`, fraction)
        )
        echoRuns.push({ ...run, label })
        progress.advance(summaryOf(run))
      }
      await echo.close()
    }
    // A floor that fails is reported, not fatal: the runs before it are the run's results.
    try {
      floors = await measureFloors({
        root,
        echo: { prefix: echoPrefix, pid: echoServer.pid },
        databaseUrl: baselineUrl,
        namespace,
        partitions: coordinator?.partitions ?? 64,
        inFlightMax: halfPeakInFlightMax,
        coordinatorRuns: halfPeakRuns
          .map(({ run }) => run)
          .filter((run) => coordinatorKeys.includes(run.target)),
        workloads,
        sessionPlan,
        progress,
        onStarted: (stop) => cleanups.push(stop)
      })
    } catch (error) {
      remarks.push(`Latency floors not measured: ${String(error).slice(0, 300)}`)
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
      `The coordinator process wrote (last lines, LOG_LEVEL as deployed: info): \`${lastLines.replace(/`/g, "'")}\``
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
    ceilingsMeasured: ceilings,
    halfPeak: {
      ...(halfPeak ? {} : { skipped: "`--no-half-peak`" }),
      fraction: halfPeakFraction,
      inFlightMax: halfPeakInFlightMax,
      workloads: workloads.map((workload) => workload.key).filter((key) => halfPeakWorkloads.has(key)),
      runs: halfPeakRuns,
      floors
    },
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
