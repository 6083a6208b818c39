/**
 * Issue 20's abuse run: each abuse of a careless or hostile caller, sent at scale to the coordinator as
 * deployed (`serve` in its own process, bench/targets/coordinatorProcess.ts: a fresh database, a random
 * prefix, 64 partitions), while
 *
 * - a probe preloaded into the coordinator (bench/lib/loopProbe.mjs, `--import`; src/ unchanged) records
 *   its event-loop delay at 10 ms resolution: the stall check;
 * - a sampler reads the coordinator's `GET /metrics` every 200 ms: `process_resident_memory_bytes`,
 *   `nodejs_heap_size_used_bytes`, `nodejs_eventloop_lag_max_seconds` (prom-client's
 *   monitorEventLoopDelay, reset at each scrape: the longest delay since the previous one),
 *   `quota_actors_resident`, `quota_slot_waiters`, and the process's CPU time from /proc;
 * - a neighbour in its own process (bench/lib/abuseNeighbour.ts) sends one command every 15 ms for
 *   OTHER users (get_usage, reserve, release, one message each, some users in the abuser's partition)
 *   and records each answer's latency and status: the stall as a client sees it, and whether the
 *   others keep their answers.
 *
 * The Done-when of issue 20, checked per scenario: memory within the bound stated below (before the
 * run, from the limits and earlier measurements, not from this run's numbers), no neighbour answer
 * slower than 100 ms, every neighbour answer the expected one, and `limit_reached` (with `bound` and
 * `max`) wherever a per-user bound is passed.
 *
 * Usage: npx tsx bench/abuse.ts [--scenario NAME]... [--out FILE]
 * Scenarios: baseline (no abuse), duplicate-waiters, new-user-flood, remembered-ids, per-user-bounds, http, deep-nesting
 * (secrets: see the report; test/security/urlPasswords.test.ts covers it). Default: all, and the
 * report goes to bench/results/<date>-abuse.md.
 */
import { fork } from "node:child_process"
import type { ChildProcess } from "node:child_process"
import { mkdir, readFile, rm, writeFile } from "node:fs/promises"
import { loadavg, tmpdir } from "node:os"
import http from "node:http"
import net from "node:net"
import { dirname, join } from "node:path"
import { monitorEventLoopDelay } from "node:perf_hooks"
import { setTimeout as sleep } from "node:timers/promises"
import { fileURLToPath } from "node:url"
import { parseArgs } from "node:util"
import type { NatsConnection } from "@nats-io/transport-node"
import { connect } from "@nats-io/transport-node"
import pg from "pg"
import { partitionOf } from "../src/domain/partition.js"
import { periodStartAt } from "../src/domain/period.js"
import type { NeighbourReport, NeighbourSample } from "./lib/abuseNeighbour.js"
import { machineInfo } from "./lib/machine.js"
import type { CoordinatorProcess } from "./targets/coordinatorProcess.js"
import { startCoordinator } from "./targets/coordinatorProcess.js"
import { natsUrl } from "./targets/natsTarget.js"
import { databaseUrl } from "./targets/pgCommon.js"

const thisFile = fileURLToPath(import.meta.url)
const root = join(dirname(thisFile), "..")
const partitions = 64
const mib = 1024 * 1024
const stallBoundMs = 100
const loadAtStart = loadavg()
const neighbourIntervalMs = 15
const neighbourExpected: Readonly<Record<string, string>> = {
  get_usage: "ok",
  reserve: "reserved",
  release: "released"
}

// ---------------------------------------------------------------------------------------------------
// Sampling the coordinator

interface MetricsSample {
  readonly atMs: number
  readonly epochMs: number
  readonly rss: number
  readonly heapUsed: number
  readonly lagMaxMs: number
  readonly resident: number
  readonly waiters: number
  readonly scrapeMs: number
}

const metricValue = (text: string, name: string): number => {
  const match = new RegExp(`^${name}(?:\\{[^}]*\\})? ([0-9.eE+-]+)$`, "m").exec(text)
  return match === null ? Number.NaN : Number(match[1])
}

const httpGet = (
  port: number,
  path: string,
  timeoutMs: number
): Promise<{ status: number; body: string; ms: number }> =>
  new Promise((resolve) => {
    const started = performance.now()
    const request = http.get(
      { host: "127.0.0.1", port, path, agent: false, timeout: timeoutMs },
      (response) => {
        let body = ""
        response.setEncoding("utf8")
        response.on("data", (chunk: string) => (body += chunk))
        response.on("end", () =>
          resolve({ status: response.statusCode ?? 0, body, ms: performance.now() - started })
        )
        response.on("error", () => resolve({ status: -1, body, ms: performance.now() - started }))
      }
    )
    request.on("timeout", () => request.destroy(new Error("timeout")))
    request.on("error", (error) =>
      resolve({
        status: error.message === "timeout" ? -2 : -1,
        body: error.message,
        ms: performance.now() - started
      })
    )
  })

/** utime + stime of a process, in ms (from /proc; Linux). */
const cpuMsOf = async (pid: number): Promise<number> => {
  const stat = await readFile(`/proc/${pid}/stat`, "utf8")
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ")
  return ((Number(fields[11]) + Number(fields[12])) * 1000) / 100
}

const makeSampler = (port: number) => {
  const samples: Array<MetricsSample> = []
  let running = true
  const started = performance.now()
  const one = async (): Promise<MetricsSample | undefined> => {
    const reply = await httpGet(port, "/metrics", 5_000)
    if (reply.status !== 200) return undefined
    const sample: MetricsSample = {
      atMs: performance.now() - started,
      epochMs: Date.now(),
      rss: metricValue(reply.body, "process_resident_memory_bytes"),
      heapUsed: metricValue(reply.body, "nodejs_heap_size_used_bytes"),
      lagMaxMs: metricValue(reply.body, "nodejs_eventloop_lag_max_seconds") * 1000,
      resident: metricValue(reply.body, "quota_actors_resident"),
      waiters: metricValue(reply.body, "quota_slot_waiters"),
      scrapeMs: reply.ms
    }
    samples.push(sample)
    return sample
  }
  const loop = (async () => {
    while (running) {
      await one()
      await sleep(200)
    }
  })()
  return {
    one,
    samples,
    stop: async () => {
      running = false
      await loop
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// The neighbour

const startNeighbour = async (prefix: string, users: ReadonlyArray<string>) => {
  const child: ChildProcess = fork(
    join(root, "bench/lib/abuseNeighbour.ts"),
    [JSON.stringify({ natsUrl, prefix, partitions, users, intervalMs: neighbourIntervalMs })],
    { cwd: root, execArgv: ["--import", "tsx"], stdio: ["ignore", "inherit", "inherit", "ipc"] }
  )
  await new Promise<void>((resolve, reject) => {
    child.once("message", () => resolve())
    child.once("exit", (code) => reject(new Error(`neighbour exited (${code})`)))
  })
  return {
    stop: () =>
      new Promise<NeighbourReport>((resolve, reject) => {
        child.removeAllListeners("exit")
        child.once("message", (message) => resolve(message as NeighbourReport))
        child.once("exit", (code) => reject(new Error(`neighbour exited (${code}) without a report`)))
        child.send("stop")
      })
  }
}

/** Users whose partition is `partition` (the abuser's), named `<stem><n>`. */
const usersIn = (partition: number, stem: string, count: number): Array<string> => {
  const users: Array<string> = []
  for (let index = 0; users.length < count; index += 1) {
    const user = `${stem}${index}`
    if (partitionOf(user, partitions) === partition) users.push(user)
  }
  return users
}

/** 20 neighbours: 8 in the abuser's partition, 12 anywhere else. */
const neighbourUsers = (abuser: string): Array<string> => {
  const partition = partitionOf(abuser, partitions)
  const others: Array<string> = []
  for (let index = 0; others.length < 12; index += 1) {
    const user = `neighbour-far-${index}`
    if (partitionOf(user, partitions) !== partition) others.push(user)
  }
  return [...usersIn(partition, "neighbour-near-", 8), ...others]
}

// ---------------------------------------------------------------------------------------------------
// Requests

const opsSubject = (prefix: string, user: string) => `${prefix}.v1.${partitionOf(user, partitions)}.ops`
const adminSubject = (prefix: string, user: string) => `${prefix}.v1.${partitionOf(user, partitions)}.admin`

type Result = Record<string, unknown> & { status: string }

interface Reply {
  readonly results: Array<Result>
  /** The NATS service error code (a 400), or "" */
  readonly errorCode: string
  readonly bytes: number
  readonly ms: number
}

const request = async (
  nc: NatsConnection,
  subject: string,
  body: string,
  timeoutMs = 30_000
): Promise<Reply> => {
  const started = performance.now()
  const reply = await nc.request(subject, body, { timeout: timeoutMs })
  const ms = performance.now() - started
  const errorCode = reply.headers?.get("Nats-Service-Error-Code") ?? ""
  if (errorCode !== "") return { results: [], errorCode, bytes: reply.data.length, ms }
  const parsed = reply.json<Result | Array<Result>>()
  return { results: Array.isArray(parsed) ? parsed : [parsed], errorCode, bytes: reply.data.length, ms }
}

/** Runs `each` over `items` with at most `width` in flight. */
const pool = async <A>(items: ReadonlyArray<A>, width: number, each: (item: A) => Promise<void>) => {
  let next = 0
  await Promise.all(
    Array.from({ length: width }, async () => {
      while (next < items.length) {
        const item = items[next]!
        next += 1
        await each(item)
      }
    })
  )
}

/** Commands grouped by their user's partition, in batches of at most `size` (one message each). */
const batchesByPartition = (commands: ReadonlyArray<Result>, size: number): Array<Array<Result>> => {
  const byPartition = new Map<number, Array<Result>>()
  for (const command of commands) {
    const partition = partitionOf(String(command["user"]), partitions)
    const list = byPartition.get(partition) ?? []
    list.push(command)
    byPartition.set(partition, list)
  }
  const batches: Array<Array<Result>> = []
  for (const list of byPartition.values())
    for (let start = 0; start < list.length; start += size) batches.push(list.slice(start, start + size))
  return batches
}

/** Sends commands batched by partition, `width` messages in flight, and counts their statuses. */
const sendBatched = async (
  nc: NatsConnection,
  prefix: string,
  commands: ReadonlyArray<Result>,
  size: number,
  width: number,
  tally: Tally,
  onResult?: (result: Result) => void
) => {
  await pool(batchesByPartition(commands, size), width, async (batch) => {
    try {
      const reply = await request(nc, opsSubject(prefix, String(batch[0]!["user"])), JSON.stringify(batch))
      if (reply.errorCode !== "") tally.add(`service-error-${reply.errorCode}`, batch.length)
      for (const result of reply.results) {
        tally.add(result.status)
        onResult?.(result)
      }
    } catch (error) {
      tally.add(String(error).includes("TIMEOUT") ? "timeout" : "error", batch.length)
    }
  })
}

class Tally {
  readonly counts = new Map<string, number>()
  add(key: string, count = 1) {
    this.counts.set(key, (this.counts.get(key) ?? 0) + count)
  }
  get(key: string) {
    return this.counts.get(key) ?? 0
  }
  toString() {
    return [...this.counts.entries()]
      .sort((a, b) => b[1] - a[1])
      .map(([key, count]) => `${key} ${count}`)
      .join(", ")
  }
}

// ---------------------------------------------------------------------------------------------------
// A scenario's frame: coordinator, sampler, neighbour, then the verdict

interface Check {
  readonly what: string
  readonly held: boolean
  readonly detail: string
}

interface ScenarioReport {
  readonly name: string
  readonly title: string
  readonly scale: Array<string>
  readonly abuser: Tally
  readonly notes: Array<string>
  readonly checks: Array<Check>
  readonly memory: {
    readonly rssBefore: number
    readonly rssPeak: number
    readonly rssAfter: number
    readonly heapBefore: number
    readonly heapPeak: number
    readonly heapAfter: number
    readonly gcHeapBefore: number
    readonly gcHeapAfter: number
    readonly gcRssAfter: number
    readonly boundRss: number
    readonly boundReason: string
  }
  readonly lagMaxMs: number
  readonly loopMaxMs: number
  readonly ownWorkMaxMs: number
  readonly residentPeak: number
  readonly waitersPeak: number
  readonly coordinatorCpuPercent: number
  readonly abuseSeconds: number
  readonly neighbour: {
    readonly count: number
    readonly p50: number
    readonly p99: number
    readonly max: number
    readonly over100: number
    readonly statuses: Tally
    readonly wrong: Array<NeighbourSample>
    readonly ownLoopDelayMaxMs: number
  }
  readonly benchLoopDelayMaxMs: number
}

interface Context {
  readonly coordinator: CoordinatorProcess
  readonly nc: NatsConnection
  readonly port: number
  readonly prefix: string
  readonly abuser: Tally
  readonly notes: Array<string>
  readonly checks: Array<Check>
  readonly scale: Array<string>
  readonly check: (what: string, held: boolean, detail: string) => void
  /** Marks the start of a phase of the abuse: slow neighbour answers are reported by phase. */
  readonly mark: (phase: string) => void
}

interface Scenario {
  readonly name: string
  readonly title: string
  /** The user whose neighbours the neighbour process plays. */
  readonly abuser: string
  readonly env?: Readonly<Record<string, string>>
  /** Peak RSS may exceed the idle RSS before the abuse by at most this (stated before the run). */
  readonly rssGrowthBound: number
  readonly boundReason: string
  /** Before the neighbour starts (seeding): not measured. */
  readonly prepare?: (context: Context) => Promise<void>
  readonly abuse: (context: Context) => Promise<void>
}

const freePort = (): Promise<number> =>
  new Promise((resolve, reject) => {
    const server = net.createServer()
    server.listen(0, "127.0.0.1", () => {
      const address = server.address()
      server.close(() => (typeof address === "object" && address !== null ? resolve(address.port) : reject()))
    })
  })

const percentile = (sorted: ReadonlyArray<number>, p: number) =>
  sorted.length === 0
    ? Number.NaN
    : sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)]!

/** Asks the probe for a full GC and returns the heap and RSS it reports after it (bytes). */
const collectGarbage = async (pid: number, probeFile: string): Promise<{ heapUsed: number; rss: number }> => {
  const count = async () =>
    (await readFile(probeFile, "utf8").catch(() => "")).split("\n").filter((line) => line.startsWith("gc "))
  const seen = (await count()).length
  process.kill(pid, "SIGUSR2")
  for (let attempt = 0; attempt < 100; attempt += 1) {
    await sleep(100)
    const lines = await count()
    if (lines.length > seen) {
      const [, , heapUsed, rss] = lines.at(-1)!.split(" ")
      return { heapUsed: Number(heapUsed), rss: Number(rss) }
    }
  }
  return { heapUsed: Number.NaN, rss: Number.NaN }
}

const runScenario = async (scenario: Scenario): Promise<ScenarioReport> => {
  const port = await freePort()
  console.log(`\n== ${scenario.name}: ${scenario.title}`)
  const probeFile = join(tmpdir(), `abuse-loop-${process.pid}-${scenario.name}.txt`)
  await rm(probeFile, { force: true })
  const coordinator = await startCoordinator(
    root,
    {
      QUOTA_HTTP_ADDR: `127.0.0.1:${port}`,
      // As deployed (coordinatorProcess.ts's default young generation), plus the loop probe.
      BENCH_COORDINATOR_NODE_FLAGS: `--max-semi-space-size=64 --expose-gc --import ${join(root, "bench/lib/loopProbe.mjs")}`,
      ABUSE_LOOP_PROBE_FILE: probeFile,
      ...scenario.env
    },
    partitions
  )
  const nc = await connect({ servers: natsUrl, name: `abuse-bench-${scenario.name}` })
  const abuser = new Tally()
  const notes: Array<string> = []
  const checks: Array<Check> = []
  const scale: Array<string> = []
  const marks: Array<{ phase: string; at: number }> = [{ phase: "before the abuse", at: 0 }]
  const context: Context = {
    coordinator,
    nc,
    port,
    prefix: coordinator.prefix,
    abuser,
    notes,
    checks,
    scale,
    check: (what, held, detail) => {
      checks.push({ what, held, detail })
      console.log(`  ${held ? "held" : "NOT HELD"}: ${what} (${detail})`)
    },
    mark: (phase) => marks.push({ phase, at: Date.now() })
  }
  const benchLoop = monitorEventLoopDelay({ resolution: 10 })
  try {
    await scenario.prepare?.(context)
    const sampler = makeSampler(port)
    await sleep(1_500)
    const gcBefore = await collectGarbage(coordinator.pid, probeFile)
    await sleep(500)
    await sampler.one()
    const before = sampler.samples.at(-1)!
    const neighbour = await startNeighbour(coordinator.prefix, neighbourUsers(scenario.abuser))
    const neighbourStartedAt = Date.now()
    await sleep(1_000)
    const cpuBefore = await cpuMsOf(coordinator.pid)
    const abuseStarted = performance.now()
    benchLoop.enable()
    const abuseStartedAt = Date.now()
    context.mark("abuse")
    await scenario.abuse(context)
    benchLoop.disable()
    context.mark("after the abuse")
    const abuseSeconds = (performance.now() - abuseStarted) / 1000
    const cpuAfter = await cpuMsOf(coordinator.pid)
    await sleep(2_000)
    const report = await neighbour.stop()
    const gcAfter = await collectGarbage(coordinator.pid, probeFile)
    const neighbourStoppedAt = Date.now()
    await sleep(500)
    await sampler.stop()
    const after = sampler.samples.at(-1)!
    const during = sampler.samples.filter((sample) => sample.atMs >= before.atMs)
    const rssPeak = Math.max(...during.map((sample) => sample.rss))
    const heapPeak = Math.max(...during.map((sample) => sample.heapUsed))
    const lagMaxMs = Math.max(
      ...during.map((sample) => sample.lagMaxMs).filter((value) => !Number.isNaN(value))
    )
    const latencies = report.samples.map((sample) => sample.latencyMs).sort((a, b) => a - b)
    const statuses = new Tally()
    for (const sample of report.samples) statuses.add(`${sample.op} ${sample.status}`)
    const wrong = report.samples.filter((sample) => neighbourExpected[sample.op] !== sample.status)
    const boundRss = before.rss + scenario.rssGrowthBound
    // Slow answers by the phase they were answered in (the last mark at or before the answer).
    const slowByPhase = new Map<string, { count: number; maxMs: number; firstAtS: number }>()
    for (const sample of report.samples) {
      if (sample.latencyMs <= stallBoundMs) continue
      const answeredAt = sample.sentAtMs + sample.latencyMs
      const phase = marks.filter((mark) => mark.at <= answeredAt).at(-1)!.phase
      const entry = slowByPhase.get(phase) ?? {
        count: 0,
        maxMs: 0,
        firstAtS: (answeredAt - abuseStartedAt) / 1000
      }
      entry.count += 1
      entry.maxMs = Math.max(entry.maxMs, sample.latencyMs)
      slowByPhase.set(phase, entry)
    }
    for (const [phase, entry] of slowByPhase)
      notes.push(
        `neighbour answers over ${stallBoundMs} ms during "${phase}": ${entry.count}, longest ${entry.maxMs.toFixed(0)} ms (first answered ${entry.firstAtS.toFixed(1)} s after the abuse started)`
      )
    for (let index = 1; index < marks.length; index += 1) {
      const from = marks[index]!.at
      const to = marks[index + 1]?.at ?? Number.POSITIVE_INFINITY
      const inPhase = during.filter((sample) => sample.epochMs >= from && sample.epochMs < to)
      if (inPhase.length === 0) continue
      notes.push(
        `during "${marks[index]!.phase}": peak RSS ${mibText(Math.max(...inPhase.map((sample) => sample.rss)))} MiB, peak heap used ${mibText(Math.max(...inPhase.map((sample) => sample.heapUsed)))} MiB (${inPhase.length} scrapes)`
      )
    }
    const slowByOp = new Tally()
    for (const sample of report.samples) if (sample.latencyMs > stallBoundMs) slowByOp.add(sample.op)
    if (slowByOp.counts.size > 0)
      notes.push(`neighbour answers over ${stallBoundMs} ms by operation: ${slowByOp}`)
    // The coordinator's own loop (the probe, 10 ms resolution), from the neighbour's start to its stop.
    const probe = (await readFile(probeFile, "utf8").catch(() => ""))
      .split("\n")
      .filter((line) => line !== "" && !line.startsWith("gc "))
      .map((line) => {
        const [at, gap, cpu] = line.split(" ")
        // The timer runs every 10 ms: the delay is the gap less that.
        return { at: Number(at), delay: Number(gap) - 10, cpu: Number(cpu) }
      })
      .filter((line) => line.at >= neighbourStartedAt && line.at <= neighbourStoppedAt)
    const worstLine = probe.reduce((worst, line) => (line.delay > worst.delay ? line : worst), probe[0]!)
    const loopMaxMs = worstLine.delay
    // The process ran on a CPU at least half the gap: its own work (or GC), not waiting for a core.
    const ownWork = (line: { delay: number; cpu: number }) => line.cpu >= 0.5 * (line.delay + 10)
    const ownWorkMaxMs = Math.max(0, ...probe.filter(ownWork).map((line) => line.delay))
    const loopByPhase = new Map<string, { delay: number; cpu: number; count: number; ownWork: number }>()
    for (const line of probe) {
      if (line.delay <= stallBoundMs) continue
      // A line covers the 250 ms before it: its phase is the one running when it was written.
      const phase = marks.filter((mark) => mark.at <= line.at).at(-1)!.phase
      const entry = loopByPhase.get(phase) ?? { delay: 0, cpu: 0, count: 0, ownWork: 0 }
      entry.count += 1
      if (ownWork(line)) entry.ownWork += 1
      if (line.delay > entry.delay) {
        entry.delay = line.delay
        entry.cpu = line.cpu
      }
      loopByPhase.set(phase, entry)
    }
    for (const [phase, entry] of loopByPhase)
      notes.push(
        `coordinator event-loop delays over ${stallBoundMs} ms during "${phase}": ${entry.count} (in 250 ms windows), ${entry.ownWork} of them with the process on a CPU at least half the gap; the longest ${entry.delay.toFixed(0)} ms, the process using ${entry.cpu.toFixed(0)} ms of CPU meanwhile`
      )
    const neighbourSummary = {
      count: latencies.length,
      p50: percentile(latencies, 50),
      p99: percentile(latencies, 99),
      max: latencies.at(-1) ?? Number.NaN,
      over100: latencies.filter((ms) => ms > stallBoundMs).length,
      statuses,
      wrong,
      ownLoopDelayMaxMs: report.ownLoopDelayMaxMs
    }
    context.check(
      `memory: peak RSS ≤ ${(boundRss / mib).toFixed(0)} MiB (idle ${(before.rss / mib).toFixed(0)} + ${(scenario.rssGrowthBound / mib).toFixed(0)})`,
      rssPeak <= boundRss,
      `peak ${(rssPeak / mib).toFixed(1)} MiB; heap retained after a full GC ${mibText(gcBefore.heapUsed)} MiB before, ${mibText(gcAfter.heapUsed)} MiB after`
    )
    context.check(
      `no coordinator event-loop stall over ${stallBoundMs} ms (in-process probe, a 10 ms timer: a stall of S ms reads S to S + 10)`,
      loopMaxMs <= stallBoundMs + 10,
      `longest delay ${loopMaxMs.toFixed(1)} ms (the process used ${worstLine.cpu.toFixed(0)} ms of CPU in that gap); longest with the process on a CPU at least half the gap (its own work) ${ownWorkMaxMs.toFixed(1)} ms; ${probe.length} windows of 250 ms`
    )
    context.check(
      `no neighbour answer slower than ${stallBoundMs} ms (the client's view: loop, NATS, Postgres commits, CPU)`,
      neighbourSummary.max <= stallBoundMs,
      `longest answer ${neighbourSummary.max.toFixed(1)} ms, ${neighbourSummary.over100} of ${neighbourSummary.count} over ${stallBoundMs} ms; metrics' event-loop lag max ${lagMaxMs.toFixed(1)} ms`
    )
    context.check(
      "every neighbour answer right",
      wrong.length === 0 && neighbourSummary.count > 0,
      wrong.length === 0
        ? `${neighbourSummary.count} answers`
        : `${wrong.length} wrong: ${wrong
            .slice(0, 5)
            .map(
              (sample) =>
                `${sample.op} ${sample.status} at ${((sample.sentAtMs - abuseStartedAt) / 1000).toFixed(1)} s`
            )
            .join("; ")}`
    )
    return {
      name: scenario.name,
      title: scenario.title,
      scale,
      abuser,
      notes,
      checks,
      memory: {
        rssBefore: before.rss,
        rssPeak,
        rssAfter: after.rss,
        heapBefore: before.heapUsed,
        heapPeak,
        heapAfter: after.heapUsed,
        gcHeapBefore: gcBefore.heapUsed,
        gcHeapAfter: gcAfter.heapUsed,
        gcRssAfter: gcAfter.rss,
        boundRss,
        boundReason: scenario.boundReason
      },
      lagMaxMs,
      loopMaxMs,
      ownWorkMaxMs,
      residentPeak: Math.max(...during.map((sample) => sample.resident)),
      waitersPeak: Math.max(...during.map((sample) => sample.waiters)),
      coordinatorCpuPercent: ((cpuAfter - cpuBefore) / (abuseSeconds * 1000)) * 100,
      abuseSeconds,
      neighbour: neighbourSummary,
      benchLoopDelayMaxMs: benchLoop.max / 1e6
    }
  } catch (error) {
    console.error(`${scenario.name} failed: ${String(error)}\ncoordinator output:\n${coordinator.output()}`)
    throw error
  } finally {
    await nc.close().catch(() => undefined)
    await coordinator.stop()
  }
}

// ---------------------------------------------------------------------------------------------------
// The scenarios

const acquire = (user: string, job: string, waitMs = 0, leaseMs = 600_000): Result => ({
  status: "",
  op: "acquire_slot",
  user,
  job,
  leaseMs,
  waitMs
})
const command = (fields: Record<string, unknown>): Result => ({ status: "", ...fields })
/** Answers of `limit_reached`, checked to name `bound` and `max`. */
const limitReachedOf = (results: ReadonlyArray<Result>, bound: string, max: number) => {
  const reached = results.filter((result) => result.status === "limit_reached")
  const wellFormed = reached.filter((result) => result["bound"] === bound && result["max"] === max)
  return { reached: reached.length, wellFormed: wellFormed.length }
}

const duplicateWaiters: Scenario = {
  name: "duplicate-waiters",
  title:
    "300 messages × 1 000 copies of one waiting acquire_slot (waitMs 300 000), the user's only slot held",
  abuser: "abuser-dup",
  env: { FAIRNESS_FREE_LIMIT: "1" },
  rssGrowthBound: 192 * mib,
  boundReason:
    "one waiter per job (revision 1.2), so no growth with the copies: only messages in flight (16 × 62 KB) and the young generation (--max-semi-space-size=64: up to 128 MiB of new space) on top of idle",
  abuse: async ({ nc, prefix, abuser, check, scale, notes, mark }) => {
    const user = "abuser-dup"
    const subject = opsSubject(prefix, user)
    const held = await request(
      nc,
      subject,
      JSON.stringify({ op: "acquire_slot", user, job: "holder", leaseMs: 600_000 })
    )
    notes.push(`the slot's holder: ${held.results[0]?.status}`)
    // Two floods of the issue's size: 2 messages in flight (one being decided while the next arrives:
    // what one message costs), then 16 in flight (NATS hands the coordinator several per socket read).
    const phases = [
      { label: "flood, 2 messages in flight", messages: 300, width: 2 },
      { label: "flood, 16 messages in flight", messages: 300, width: 16 }
    ]
    const messages = phases.reduce((sum, phase) => sum + phase.messages, 0)
    const copies = 1_000
    const body = JSON.stringify(
      Array.from({ length: copies }, () => ({ op: "acquire_slot", user, job: "w", waitMs: 300_000 }))
    )
    scale.push(
      `${phases.map((phase) => `${phase.messages} messages × ${copies} copies, ${phase.width} in flight`).join(", then ")} (${(body.length / 1024).toFixed(0)} KB a message)`
    )
    let answered = 0
    let inFlight = 0
    const replyMs = new Map<string, Array<number>>()
    const started = performance.now()
    const sends: Array<Promise<void>> = []
    for (const phase of phases) {
      mark(phase.label)
      const times: Array<number> = []
      replyMs.set(phase.label, times)
      const phaseStarted = performance.now()
      for (let index = 0; index < phase.messages; index += 1) {
        // The message holding the newest copy waits for the next message: never wait for all.
        while (inFlight >= phase.width) await sleep(1)
        inFlight += 1
        sends.push(
          request(nc, subject, body, 120_000)
            .then(
              (reply) => {
                times.push(reply.ms)
                for (const result of reply.results) abuser.add(result.status)
                if (reply.errorCode !== "") abuser.add(`service-error-${reply.errorCode}`, copies)
              },
              (error: unknown) => abuser.add(String(error).includes("TIMEOUT") ? "timeout" : "error", copies)
            )
            .finally(() => {
              inFlight -= 1
              answered += 1
            })
        )
      }
      notes.push(`${phase.label}: sent in ${((performance.now() - phaseStarted) / 1000).toFixed(1)} s`)
    }
    while (answered < messages - 1) await sleep(20)
    // Only the message holding the newest copy (parked) is unanswered: free the slot.
    await sleep(500)
    mark("release of the holder")
    const freed = await request(nc, subject, JSON.stringify({ op: "release_slot", user, job: "holder" }))
    notes.push(`release of the holder with one copy parked: ${freed.results[0]?.status}`)
    await Promise.all(sends)
    const floodMs = performance.now() - started
    const busy = abuser.get("busy")
    const acquired = abuser.get("acquired")
    check(
      "all copies but one answered busy at once, the last one acquired when the slot was freed",
      busy === messages * copies - 1 && acquired === 1,
      `busy ${busy}, acquired ${acquired} of ${messages * copies} in ${(floodMs / 1000).toFixed(1)} s`
    )
    for (const [label, times] of replyMs) {
      times.sort((a, b) => a - b)
      notes.push(
        `reply time of a 1 000-copy message, ${label}: p50 ${percentile(times, 50).toFixed(0)} ms, p99 ${percentile(times, 99).toFixed(0)} ms (the message holding the newest copy waits for the next message)`
      )
    }

    // The slot_waiters bound: 1 050 distinct jobs waiting behind "w" (which now holds the slot).
    const jobs = 1_050
    mark("slot_waiters bound")
    scale.push(`then ${jobs} distinct jobs waiting (one message each), past slot_waiters (1 000)`)
    const waiterResults: Array<Result> = []
    const waits = Array.from({ length: jobs }, (_, index) =>
      request(
        nc,
        subject,
        JSON.stringify({ op: "acquire_slot", user, job: `j${index}`, waitMs: 300_000 }),
        8_000
      )
        .then((reply) => {
          waiterResults.push(...reply.results)
          for (const result of reply.results) abuser.add(`waiters: ${result.status}`)
        })
        .catch(() => abuser.add("waiters: still parked after 8 s"))
    )
    await Promise.all(waits)
    const reached = limitReachedOf(waiterResults, "slot_waiters", 1_000)
    check(
      "slot_waiters past 1 000 answered limit_reached (bound slot_waiters, max 1000)",
      reached.reached === jobs - 1_000 && reached.wellFormed === reached.reached,
      `${reached.reached} limit_reached (${reached.wellFormed} with bound and max), ${abuser.get("waiters: still parked after 8 s")} still parked`
    )
  }
}

const newUserFlood: Scenario = {
  name: "new-user-flood",
  title:
    "11 000 users each with a parked waiter (past the 10 000 waiting actors), then 110 000 new users (past the 100 000 resident cap)",
  abuser: "waiter-0",
  env: { FAIRNESS_FREE_LIMIT: "1" },
  rssGrowthBound: 512 * mib,
  boundReason:
    "110 000 resident actors at ≤ 2.4 KB of RSS each (bench:memory, 2026-11-25) = 252 MiB, plus 10 000 actors with waiters and the young generation (128 MiB)",
  abuse: async ({ nc, prefix, abuser, check, scale, notes, mark }) => {
    const waiting = 11_000
    const waiterUsers = Array.from({ length: waiting }, (_, index) => `waiter-${index}`)
    scale.push(
      `${waiting} users: acquire_slot (their only slot), then a waiting acquire_slot (waitMs 300 000) each`
    )
    const holders = new Tally()
    mark("holders acquire")
    let started = performance.now()
    await sendBatched(
      nc,
      prefix,
      waiterUsers.map((user) => acquire(user, "a")),
      500,
      8,
      holders
    )
    notes.push(`holders: ${holders} in ${((performance.now() - started) / 1000).toFixed(1)} s`)
    const waitAnswers = new Tally()
    const waitFor = (user: string) =>
      request(
        nc,
        opsSubject(prefix, user),
        JSON.stringify({ op: "acquire_slot", user, job: "b", waitMs: 300_000 }),
        120_000
      )
        .then((reply) =>
          waitAnswers.add(`${reply.results[0]?.status} after ${reply.ms < 5_000 ? "<5 s" : "≥5 s"}`)
        )
        .catch(() => waitAnswers.add("no answer"))
    // One message each, sent at once: first 10 000 (up to the waiting actors' bound), then 1 000 more,
    // each of which evicts the actor that has rested longest with a waiter.
    mark("waiting acquires of users 1-10 000, all at once")
    const parked = waiterUsers.slice(0, 10_000).map(waitFor)
    await sleep(2_500)
    mark("waiting acquires of users 10 001-11 000, all at once (each evicts one)")
    parked.push(...waiterUsers.slice(10_000).map(waitFor))
    await sleep(2_500)
    notes.push(`waiting acquires 2.5 s after the last: ${waitAnswers} (the rest parked)`)

    const flood = 110_000
    mark("new-user flood (get_usage)")
    scale.push(`then ${flood} new users' get_usage, 500 per message by partition, 8 messages in flight`)
    const floodTally = new Tally()
    started = performance.now()
    await sendBatched(
      nc,
      prefix,
      Array.from({ length: flood }, (_, index) => command({ op: "get_usage", user: `new-${index}` })),
      500,
      8,
      floodTally
    )
    const floodSeconds = (performance.now() - started) / 1000
    for (const [key, count] of floodTally.counts) abuser.add(`new users' get_usage: ${key}`, count)
    const fresh = 2_000
    mark("new users' reserves")
    const reserveTally = new Tally()
    await sendBatched(
      nc,
      prefix,
      Array.from({ length: fresh }, (_, index) =>
        command({ op: "reserve", user: `newer-${index}`, meter: "work", amount: 1, id: "r1", ttlMs: 600_000 })
      ),
      500,
      8,
      reserveTally
    )
    for (const [key, count] of reserveTally.counts) abuser.add(`then new users' reserve: ${key}`, count)
    check(
      "new users served past both caps (never overloaded)",
      floodTally.get("ok") === flood && reserveTally.get("reserved") === fresh,
      `get_usage ${floodTally} in ${floodSeconds.toFixed(1)} s (${(flood / floodSeconds).toFixed(0)}/s); reserve ${reserveTally}`
    )
    notes.push(`waiting acquires at the end: ${waitAnswers}`)
    check(
      "waiting actors past 10 000: the longest resting ones evicted, their waiters answered busy",
      waitAnswers.get("busy after <5 s") >= waiting - 10_000,
      `${waitAnswers}`
    )
    void parked
  }
}

const rememberedIds: Scenario = {
  name: "remembered-ids",
  title:
    "a user with 150 000 closed holds and 150 000 adjust ids (seeded in Postgres), replays of old ids mixed with 50 neighbours' reserves in the same messages",
  abuser: "heavy",
  rssGrowthBound: 192 * mib,
  boundReason:
    "the load reads at most 10 000 closed holds and 10 000 adjust ids per user (loadRememberedIdsPerUserMax), recalls at most 1 000 ids per group; plus the young generation (128 MiB)",
  prepare: async ({ coordinator, notes }) => {
    const client = new pg.Client({ connectionString: databaseUrl(coordinator.database) })
    await client.connect()
    try {
      const user = "heavy"
      const count = 150_000
      const newest = Date.now() - 60_000
      const started = performance.now()
      await client.query(
        `insert into quota.holds
           (user_id, id, meter, amount, consumed, state, expires_at, created_at, closed_at, partition)
         select $1, 'old-h-' || n, 'work', 1, 1, 'committed', $2::bigint + 600000, $2::bigint - ($3::bigint - n) * 1000 - 10,
                $2::bigint - ($3::bigint - n) * 1000, $4
         from generate_series(0, $3::bigint - 1) as n`,
        [user, newest, count, partitionOf(user, partitions)]
      )
      const periodStart = periodStartAt("month", Date.now())
      // Within the last 7 days and this month: one every 2 s from newest back (150 000 × 2 s ≈ 3.5 days).
      await client.query(
        `insert into quota.usage_ledger (user_id, meter, period_start, operation, hold_id, key, requested, delta, at)
         select $1, 'work', $2::bigint, 'adjust', null, 'old-a-' || n, 1, 1, $3::bigint - ($4::bigint - n) * 2000
         from generate_series(0, $4::bigint - 1) as n`,
        [user, periodStart, newest, count]
      )
      await client.query(
        `insert into quota.usage_totals (user_id, meter, period_start, used) values ($1, 'work', $2, $3)
         on conflict do nothing`,
        [user, periodStart, 2 * count]
      )
      notes.push(
        `seeded ${count} closed holds and ${count} adjust ids for "heavy" in ${((performance.now() - started) / 1000).toFixed(1)} s (this month: the month started ${new Date(periodStart ?? 0).toISOString()})`
      )
    } finally {
      await client.end()
    }
  },
  abuse: async ({ nc, prefix, abuser, check, scale, notes, mark }) => {
    const user = "heavy"
    const partition = partitionOf(user, partitions)
    const inMessage = usersIn(partition, "same-message-", 50)
    const rounds = 200
    scale.push(
      `${rounds} messages, each 25 replayed adjusts + 25 replayed reserves of random old ids of "heavy" (of 150 000 each) + 50 other users' reserves; 4 in flight`
    )
    const neighbourTally = new Tally()
    const replayTally = new Tally()
    let seed = 1
    const random = (below: number) => {
      seed = (seed * 1103515245 + 12345) % 2147483648
      return seed % below
    }
    const messages = Array.from({ length: rounds }, (_, round) => {
      const commands: Array<Record<string, unknown>> = []
      for (let index = 0; index < 25; index += 1) {
        commands.push({ op: "adjust", user, meter: "work", amount: 1, id: `old-a-${random(150_000)}` })
        commands.push({ op: "reserve", user, meter: "work", amount: 1, id: `old-h-${random(150_000)}` })
      }
      for (const other of inMessage)
        commands.push({
          op: "reserve",
          user: other,
          meter: "work",
          amount: 1,
          id: `m-${round}`,
          ttlMs: 600_000
        })
      return commands
    })
    mark("first command of heavy (its load: the newest 10 000 closed holds and 10 000 adjust ids)")
    const loaded = await request(nc, opsSubject(prefix, user), JSON.stringify({ op: "get_usage", user }))
    notes.push(
      `heavy's first command (get_usage, loads it): ${loaded.results[0]?.status} in ${loaded.ms.toFixed(0)} ms`
    )
    await sleep(1_000)
    mark("replays mixed with other users' reserves")
    const replyMs: Array<number> = []
    await pool(messages, 4, async (commands) => {
      try {
        const reply = await request(nc, opsSubject(prefix, user), JSON.stringify(commands))
        replyMs.push(reply.ms)
        reply.results.forEach((result, index) => {
          const sent = commands[index]!
          if (sent["user"] === user) replayTally.add(`${String(sent["op"])} ${result.status}`)
          else neighbourTally.add(`same-message reserve ${result.status}`)
        })
      } catch (error) {
        abuser.add(String(error).includes("TIMEOUT") ? "timeout" : "error", commands.length)
      }
    })
    for (const [key, count] of replayTally.counts) abuser.add(`replayed ${key}`, count)
    for (const [key, count] of neighbourTally.counts) abuser.add(key, count)
    replyMs.sort((a, b) => a - b)
    check(
      "replays answered exists (adjust) and closed (reserve), never charged again",
      replayTally.get("adjust exists") === rounds * 25 && replayTally.get("reserve closed") === rounds * 25,
      `${replayTally}`
    )
    check(
      "the 50 other users in the same messages reserved every time",
      neighbourTally.get("same-message reserve reserved") === rounds * 50,
      `${neighbourTally}; reply p50 ${percentile(replyMs, 50).toFixed(0)} ms, max ${replyMs.at(-1)?.toFixed(0)} ms`
    )
    const usage = await request(nc, opsSubject(prefix, user), JSON.stringify({ op: "get_usage", user }))
    const used = (usage.results[0]?.["meters"] as Array<{ meter: string; used: number }> | undefined)?.find(
      (meter) => meter.meter === "work"
    )?.used
    check("heavy's usage unchanged by the replays (300 000 seeded)", used === 300_000, `used ${used}`)
  }
}

const perUserBounds: Scenario = {
  name: "per-user-bounds",
  title:
    "fairness off: 10 050 pending holds, 10 050 consume keys on one hold, 1 050 slots; 1 000 renew_slot at 1 and at 1 000 slots",
  abuser: "bounds-holds",
  env: { FAIRNESS_ENABLED: "false" },
  rssGrowthBound: 192 * mib,
  boundReason:
    "10 000 pending holds + 10 000 consume keys + 1 000 slots of three users (a few MiB), plus the young generation (128 MiB)",
  abuse: async ({ nc, prefix, abuser, check, scale, notes, mark }) => {
    const sendAll = async (user: string, commands: ReadonlyArray<Record<string, unknown>>) => {
      const results: Array<Result> = []
      for (let start = 0; start < commands.length; start += 1_000) {
        const reply = await request(
          nc,
          opsSubject(prefix, user),
          JSON.stringify(commands.slice(start, start + 1_000))
        )
        results.push(...reply.results)
      }
      return results
    }
    // Pending holds.
    const holdsUser = "bounds-holds"
    mark("pending holds")
    scale.push("10 050 reserves of new ids by one user, 1 000 per message")
    const holds = await sendAll(
      holdsUser,
      Array.from({ length: 10_050 }, (_, index) => ({
        op: "reserve",
        user: holdsUser,
        meter: "work",
        amount: 1,
        id: `h${index}`
      }))
    )
    for (const result of holds) abuser.add(`reserve ${result.status}`)
    const holdsReached = limitReachedOf(holds, "pending_holds", 10_000)
    check(
      "pending holds past 10 000: limit_reached, bound pending_holds, max 10000",
      holdsReached.reached === 50 && holdsReached.wellFormed === 50,
      `${holds.filter((result) => result.status === "reserved").length} reserved, ${holdsReached.reached} limit_reached (${holdsReached.wellFormed} with bound and max)`
    )
    // Consume keys.
    const keysUser = "bounds-keys"
    mark("consume keys")
    scale.push("10 050 consumes with distinct keys on one hold, 1 000 per message")
    await sendAll(keysUser, [{ op: "reserve", user: keysUser, meter: "work", amount: 1_000_000, id: "big" }])
    const keys = await sendAll(
      keysUser,
      Array.from({ length: 10_050 }, (_, index) => ({
        op: "consume",
        user: keysUser,
        id: "big",
        amount: 1,
        key: `k${index}`
      }))
    )
    for (const result of keys) abuser.add(`consume ${result.status}`)
    const keysReached = limitReachedOf(keys, "consume_keys", 10_000)
    check(
      "consume keys past 10 000: limit_reached, bound consume_keys, max 10000",
      keysReached.reached === 50 && keysReached.wellFormed === 50,
      `${keys.filter((result) => result.status === "consumed").length} consumed, ${keysReached.reached} limit_reached`
    )
    // Slots, and renew_slot's cost at 1 and at 1 000 slots.
    const slotsUser = "bounds-slots"
    const renew = async () => {
      const started = performance.now()
      const results = await sendAll(
        slotsUser,
        Array.from({ length: 1_000 }, () => ({
          op: "renew_slot",
          user: slotsUser,
          job: "j0",
          leaseMs: 600_000
        }))
      )
      for (const result of results) abuser.add(`renew_slot ${result.status}`)
      return performance.now() - started
    }
    await sendAll(slotsUser, [{ op: "acquire_slot", user: slotsUser, job: "j0", leaseMs: 600_000 }])
    mark("renew at 1 slot")
    await renew() // warm
    const renewAtOne = await renew()
    scale.push(
      "1 050 acquire_slot of distinct jobs by one user, then 1 000 renew_slot in one message at 1 and at 1 000 slots"
    )
    mark("1 050 acquires")
    const slots = await sendAll(
      slotsUser,
      Array.from({ length: 1_049 }, (_, index) => ({
        op: "acquire_slot",
        user: slotsUser,
        job: `j${index + 1}`,
        leaseMs: 600_000
      }))
    )
    for (const result of slots) abuser.add(`acquire_slot ${result.status}`)
    const slotsReached = limitReachedOf(slots, "slots", 1_000)
    check(
      "slots past 1 000 with fairness off: limit_reached, bound slots, max 1000",
      slotsReached.reached === 50 && slotsReached.wellFormed === 50,
      `${slots.filter((result) => result.status === "acquired").length} more acquired (1 000 in all), ${slotsReached.reached} limit_reached`
    )
    mark("renew at 1 000 slots")
    const renewAtThousand = await renew()
    notes.push(
      `1 000 renew_slot in one message: ${renewAtOne.toFixed(0)} ms at 1 slot, ${renewAtThousand.toFixed(0)} ms at 1 000 slots`
    )
    check(
      "renew_slot's cost flat in the slots held (1 000 renews at 1 000 slots within 2× of at 1 slot, or +100 ms)",
      renewAtThousand <= Math.max(2 * renewAtOne, renewAtOne + 100),
      `${renewAtOne.toFixed(0)} ms → ${renewAtThousand.toFixed(0)} ms`
    )
  }
}

const httpAbuse: Scenario = {
  name: "http",
  title: "100 idle sockets and an endless chunked body to a 405 path while /healthz is polled every 50 ms",
  abuser: "http-nobody",
  rssGrowthBound: 64 * mib,
  boundReason: "the HTTP server reads no body (413 and close) and keeps at most 256 connections",
  abuse: async ({ port, abuser, check, scale, notes, mark }) => {
    const idleCount = 100
    scale.push(
      `${idleCount} idle TCP connections (nothing sent), 1 POST /metrics with an endless chunked body, /healthz polled every 50 ms for 10 s`
    )
    const idle: Array<net.Socket> = []
    const idleClosedAt: Array<number> = []
    const started = performance.now()
    for (let index = 0; index < idleCount; index += 1) {
      const socket = net.connect(port, "127.0.0.1")
      socket.on("error", () => undefined)
      socket.on("close", () => idleClosedAt.push(performance.now() - started))
      idle.push(socket)
    }
    // The endless body: written as fast as the socket takes it, until the server closes.
    let bodyBytes = 0
    let bodyClosedAtMs = Number.NaN
    let bodyResponse = ""
    const chunk = Buffer.alloc(64 * 1024, "x")
    const framed = Buffer.concat([
      Buffer.from(`${chunk.length.toString(16)}\r\n`),
      chunk,
      Buffer.from("\r\n")
    ])
    const body = net.connect(port, "127.0.0.1", () => {
      body.write("POST /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n")
      const pump = () => {
        while (!body.destroyed && body.writable) {
          bodyBytes += framed.length
          if (!body.write(framed)) {
            body.once("drain", pump)
            return
          }
        }
      }
      pump()
    })
    body.on("data", (data: Buffer) => (bodyResponse += data.toString("latin1")))
    body.on("error", () => undefined)
    body.on("close", () => (bodyClosedAtMs = performance.now() - started))
    const health: Array<{ status: number; ms: number }> = []
    mark("polling /healthz")
    const pollUntil = performance.now() + 10_000
    while (performance.now() < pollUntil) {
      const next = performance.now() + 50
      health.push(await httpGet(port, "/healthz", 5_000))
      await sleep(Math.max(0, next - performance.now()))
    }
    for (const socket of idle) socket.destroy()
    body.destroy()
    const statuses = new Tally()
    for (const reply of health) statuses.add(`/healthz ${reply.status}`)
    for (const [key, count] of statuses.counts) abuser.add(key, count)
    const healthMs = health.map((reply) => reply.ms).sort((a, b) => a - b)
    check(
      "/healthz answered 200 throughout",
      statuses.get("/healthz 200") === health.length,
      `${statuses}; p99 ${percentile(healthMs, 99).toFixed(1)} ms, max ${healthMs.at(-1)?.toFixed(1)} ms`
    )
    const statusLine = bodyResponse.split("\r\n")[0] ?? ""
    check(
      "the endless body's connection answered and closed",
      !Number.isNaN(bodyClosedAtMs) && bodyClosedAtMs < 6_000,
      `"${statusLine}", closed after ${bodyClosedAtMs.toFixed(0)} ms, ${(bodyBytes / 1024).toFixed(0)} KiB written by then`
    )
    idleClosedAt.sort((a, b) => a - b)
    notes.push(
      `idle sockets closed by the server during the 10 s: ${idleClosedAt.length} of ${idleCount}${idleClosedAt.length > 0 ? ` (first after ${idleClosedAt[0]!.toFixed(0)} ms, last after ${idleClosedAt.at(-1)!.toFixed(0)} ms)` : ""}`
    )
  }
}

const deepNesting: Scenario = {
  name: "deep-nesting",
  title: "1 MiB bodies of nested arrays; list_holds state all of a user with 20 000 holds of 256-byte ids",
  abuser: "lister",
  rssGrowthBound: 192 * mib,
  boundReason:
    "depth refused before JSON.parse; list_holds replies bounded by the 1 MiB payload while built; the user's load is at most 10 000 pending + 10 000 closed holds; plus the young generation (128 MiB)",
  prepare: async ({ coordinator, notes }) => {
    const client = new pg.Client({ connectionString: databaseUrl(coordinator.database) })
    await client.connect()
    try {
      const user = "lister"
      const now = Date.now()
      const pad = "x".repeat(240)
      await client.query(
        `insert into quota.holds
           (user_id, id, meter, amount, consumed, state, expires_at, created_at, closed_at, partition)
         select $1, $2 || lpad(n::text, 16, '0'), 'work', 1, case when n < 5000 then 0 else 1 end,
                case when n < 5000 then 'pending' else 'committed' end,
                $3::bigint + 3600000, $3::bigint - 3600000 + n, case when n < 5000 then null else $3::bigint - 1000 end, $4
         from generate_series(0, 19999) as n`,
        [user, pad, now, partitionOf(user, partitions)]
      )
      notes.push('seeded 5 000 pending and 15 000 committed holds with 256-byte ids for "lister"')
    } finally {
      await client.end()
    }
  },
  abuse: async ({ nc, prefix, abuser, check, scale, notes, mark }) => {
    const user = "lister"
    const depth = 524_000
    const nested = "[".repeat(depth) + "]".repeat(depth)
    const objects = '{"a":'.repeat(174_000) + "1" + "}".repeat(174_000)
    scale.push(
      `20 messages of ${(nested.length / 1024).toFixed(0)} KiB of nested arrays and 20 of ${(objects.length / 1024).toFixed(0)} KiB of nested objects, one at a time`
    )
    const nestedMs: Array<number> = []
    mark("nested bodies")
    for (const [label, body] of [
      ["nested arrays", nested],
      ["nested objects", objects]
    ] as const)
      for (let index = 0; index < 20; index += 1) {
        try {
          const reply = await request(nc, opsSubject(prefix, user), body, 10_000)
          nestedMs.push(reply.ms)
          abuser.add(
            `${label}: ${reply.errorCode === "" ? reply.results[0]?.status : `service error ${reply.errorCode}`}`
          )
        } catch (error) {
          abuser.add(`${label}: ${String(error).slice(0, 60)}`)
        }
      }
    nestedMs.sort((a, b) => a - b)
    check(
      "nested bodies refused with 400 quickly",
      abuser.get("nested arrays: service error 400") === 20 &&
        abuser.get("nested objects: service error 400") === 20 &&
        (nestedMs.at(-1) ?? Infinity) < 100,
      `reply p50 ${percentile(nestedMs, 50).toFixed(1)} ms, max ${nestedMs.at(-1)?.toFixed(1)} ms`
    )
    scale.push("then 30 list_holds state all limit 1 000 of the user (admin subject), 2 in flight")
    mark("first command of the lister (its load: 5 000 pending + 10 000 closed holds)")
    const loaded = await request(nc, opsSubject(prefix, user), JSON.stringify({ op: "get_usage", user }))
    notes.push(
      `the lister's first command (get_usage, loads it): ${loaded.results[0]?.status} in ${loaded.ms.toFixed(0)} ms`
    )
    await sleep(1_000)
    const lists: Array<Reply> = []
    mark("list_holds")
    await pool(
      Array.from({ length: 30 }, (_, index) => index),
      2,
      async () => {
        const reply = await request(
          nc,
          adminSubject(prefix, user),
          JSON.stringify({ op: "list_holds", user, state: "all", limit: 1_000 })
        )
        lists.push(reply)
        const result = reply.results[0]
        abuser.add(
          `list_holds: ${reply.errorCode === "" ? `${result?.status} (${(result?.["holds"] as Array<unknown> | undefined)?.length} holds, more ${String(result?.["more"])})` : `service error ${reply.errorCode}`}`
        )
      }
    )
    const bytes = Math.max(...lists.map((reply) => reply.bytes))
    const listMs = lists.map((reply) => reply.ms).sort((a, b) => a - b)
    notes.push(
      `list_holds reply: largest ${(bytes / 1024).toFixed(0)} KiB, time p50 ${percentile(listMs, 50).toFixed(0)} ms, max ${listMs.at(-1)?.toFixed(0)} ms`
    )
    check(
      "list_holds all answered within the 1 MiB payload",
      lists.every((reply) => reply.errorCode === "" && reply.results[0]?.status === "ok") &&
        bytes <= 1_048_576,
      `largest reply ${bytes} bytes`
    )
  }
}

const baseline: Scenario = {
  name: "baseline",
  title: "no abuse: the neighbour alone for 10 s (what this shared machine gives without an abuser)",
  abuser: "nobody",
  rssGrowthBound: 64 * mib,
  boundReason: "nothing sent but the neighbour's commands",
  abuse: async () => {
    await sleep(10_000)
  }
}

const scenarios: ReadonlyArray<Scenario> = [
  baseline,
  duplicateWaiters,
  newUserFlood,
  rememberedIds,
  perUserBounds,
  httpAbuse,
  deepNesting
]

// ---------------------------------------------------------------------------------------------------
// The report

const mibText = (bytes: number) => `${(bytes / mib).toFixed(1)}`

const markdown = (reports: ReadonlyArray<ScenarioReport>, started: Date): string => {
  const machine = machineInfo()
  const where = `${machine.cores} × ${machine.cpuModel}, ${machine.memoryGiB} GiB, Node ${machine.node}, ${machine.platform}`
  const lines: Array<string> = []
  lines.push(`# Abuse run (issue 20), ${started.toISOString().slice(0, 10)}`)
  lines.push("")
  const load = loadAtStart.map((value) => value.toFixed(1)).join(", ")
  lines.push(
    `\`npx tsx bench/abuse.ts\` on ${machine.code}, ${started.toISOString()}; ${where}; load average at the start ${load} (other sessions' tests share the 2 cores). The coordinator runs as deployed (\`serve\` in its own process, fresh database, 64 partitions, \`--max-semi-space-size=64\`), one coordinator per scenario, with two bench-side additions that change nothing in src/: \`--import bench/lib/loopProbe.mjs\` (a 10 ms timer: the longest gap between its runs per 250 ms window, less 10 ms, is the event-loop delay, with the CPU time the process used in that gap) and \`--expose-gc\` (a full GC on SIGUSR2 before and after the abuse, for the heap the process retains).`
  )
  lines.push("")
  lines.push(
    `- **Memory**: RSS and heap from its \`/metrics\` every 200 ms. The bound is on peak RSS: idle RSS plus a growth stated per scenario before the first run (from the limits and bench:memory), including up to 128 MiB of young generation. "Heap after full GC" is what the process retains.`
  )
  lines.push(
    `- **Stalls**: the probe's longest delay ("all"), and the longest among gaps in which the process used at least half the gap in CPU ("own work": its own work or GC; a gap with little CPU is the process waiting for a core on this shared machine). \`nodejs_eventloop_lag_max_seconds\` is also given, but it is sampled every 100 ms, so it reads at least 100 ms even when idle.`
  )
  lines.push(
    `- **Neighbours**: a process of its own sends one command every ${neighbourIntervalMs} ms for 20 other users (8 in the abuser's partition): \`get_usage\`, \`reserve\`, \`release\` in turn, one message each, expecting \`ok\`, \`reserved\`, \`released\`; latency is send to answer (the loop, NATS, Postgres commits for reserve/release, and CPU contention). The \`baseline\` scenario is the same neighbour with no abuser: the floor this machine gives at the time.`
  )
  lines.push("")
  lines.push("## Summary")
  lines.push("")
  lines.push(
    "| scenario | RSS idle → peak → after (MiB) | bound (MiB) | heap idle → peak → after (MiB) | heap after full GC, before → after (MiB) | loop delay max, all / own work (ms) | neighbour p99 / max (ms) | neighbours wrong | Done-when |"
  )
  lines.push("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
  for (const report of reports) {
    const memory = report.memory
    const held = report.checks.every((check) => check.held)
    lines.push(
      `| ${report.name} | ${mibText(memory.rssBefore)} → ${mibText(memory.rssPeak)} → ${mibText(memory.rssAfter)} | ${mibText(memory.boundRss)} | ${mibText(memory.heapBefore)} → ${mibText(memory.heapPeak)} → ${mibText(memory.heapAfter)} | ${mibText(memory.gcHeapBefore)} → ${mibText(memory.gcHeapAfter)} | ${report.loopMaxMs.toFixed(0)} / ${report.ownWorkMaxMs.toFixed(0)} | ${report.neighbour.p99.toFixed(1)} / ${report.neighbour.max.toFixed(1)} | ${report.neighbour.wrong.length} of ${report.neighbour.count} | ${report.name === "baseline" ? "(no abuse: the floor)" : held ? "held" : "**not held**"} |`
    )
  }
  lines.push("")
  for (const report of reports) {
    lines.push(`## ${report.name}`)
    lines.push("")
    lines.push(report.title + ".")
    lines.push("")
    lines.push(`Scale: ${report.scale.join("; ")}. The abuse took ${report.abuseSeconds.toFixed(1)} s.`)
    lines.push("")
    for (const check of report.checks)
      lines.push(`- ${check.held ? "held" : "**NOT HELD**"}: ${check.what}: ${check.detail}`)
    lines.push("")
    lines.push(`- memory bound's reason: ${report.memory.boundReason}`)
    lines.push(
      `- coordinator CPU during the abuse: ${report.coordinatorCpuPercent.toFixed(0)} % of one core; event-loop delay max (probe) ${report.loopMaxMs.toFixed(1)} ms; /metrics' nodejs_eventloop_lag_max_seconds max ${report.lagMaxMs.toFixed(1)} ms (sampled every 100 ms, so it reads at least 100 ms)`
    )
    lines.push(
      `- neighbour: ${report.neighbour.count} answers, p50 ${report.neighbour.p50.toFixed(1)} ms, p99 ${report.neighbour.p99.toFixed(1)} ms, max ${report.neighbour.max.toFixed(1)} ms, ${report.neighbour.over100} over 100 ms; ${report.neighbour.statuses}; its own event-loop delay max ${report.neighbour.ownLoopDelayMaxMs.toFixed(1)} ms`
    )
    lines.push(
      `- quota_actors_resident peak ${report.residentPeak}, quota_slot_waiters peak ${report.waitersPeak}`
    )
    lines.push(`- abuser's answers: ${report.abuser}`)
    lines.push(
      `- the bench process's own event-loop delay max during the abuse: ${report.benchLoopDelayMaxMs.toFixed(0)} ms`
    )
    for (const note of report.notes) lines.push(`- ${note}`)
    lines.push("")
  }
  return lines.join("\n")
}

const main = async () => {
  const { values } = parseArgs({
    options: { scenario: { type: "string", multiple: true }, out: { type: "string" } }
  })
  const chosen =
    values.scenario === undefined
      ? scenarios
      : scenarios.filter((scenario) => values.scenario!.includes(scenario.name))
  if (chosen.length === 0)
    throw new Error(`no such scenario; choose from ${scenarios.map((scenario) => scenario.name).join(", ")}`)
  const started = new Date()
  const reports: Array<ScenarioReport> = []
  for (const scenario of chosen) reports.push(await runScenario(scenario))
  const text = markdown(reports, started)
  const out = values.out ?? join(root, "bench/results", `${started.toISOString().slice(0, 10)}-abuse.md`)
  await mkdir(dirname(out), { recursive: true })
  await writeFile(out, text + "\n")
  console.log(`\n${text}\n\nwritten to ${out}`)
}

await main()
