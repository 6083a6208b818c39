/**
 * Scaling bench: throughput of 1, 2 and 3 `quota-coordinator serve` processes sharing one NATS and one
 * Postgres (scaled out by partition ownership, src/cluster/PartitionOwnership.ts), driven through the
 * SDK (`QuotaClient`, commands coalesced per partition) by a closed loop of callers, each doing
 * reserve-then-commit cycles on users drawn uniformly from many. Fixed warm-up and measured window.
 *
 *   npx tsx bench/scaling/run.ts [--processes 1,2,3] [--rounds 2] [--seconds 10] [--warmup 3]
 *                                [--inflight 512] [--users 10000] [--partitions 64]
 *
 * Prints a Markdown table and writes it to bench/scaling/results-<date>.md. Each run gets its own
 * database (`bench_scaling_<tag>`, dropped after) and subject prefix. The CPU column says where the
 * machine's cores went while measured (percent of one core; 2 cores = 200), read from /proc: on a
 * shared 2-core machine it is what tells whether adding processes could have helped at all.
 */
import type { ChildProcess } from "node:child_process"
import { spawn } from "node:child_process"
import { randomBytes } from "node:crypto"
import { writeFileSync } from "node:fs"
import os from "node:os"
import { join } from "node:path"
import type pg from "pg"
import { QuotaClient } from "../../src/client/QuotaClient.js"
import type { CpuShares } from "../lib/cpu.js"
import { formatCpu, startCpuMeter } from "../lib/cpu.js"
import { setTimeout as sleep } from "node:timers/promises"
import { makeLatencyRecorder } from "../lib/latency.js"
import { machineInfo } from "../lib/machine.js"
import { makeRng } from "../lib/rng.js"
import { deleteEventsStream, natsUrl } from "../targets/natsTarget.js"
import { createDatabase, databaseUrl, makePool } from "../targets/pgCommon.js"

// ---------------------------------------------------------------------------------------------
// Settings
// ---------------------------------------------------------------------------------------------

const argument = (name: string, fallback: string): string => {
  const index = process.argv.indexOf(`--${name}`)
  return index >= 0 && process.argv[index + 1] !== undefined ? process.argv[index + 1]! : fallback
}

const settings = {
  processes: argument("processes", "1,2,3").split(",").map(Number),
  rounds: Number(argument("rounds", "2")),
  measureMs: Number(argument("seconds", "10")) * 1_000,
  warmupMs: Number(argument("warmup", "3")) * 1_000,
  inflight: Number(argument("inflight", "512")),
  users: Number(argument("users", "10000")),
  partitions: Number(argument("partitions", "64"))
}

const root = join(import.meta.dirname, "..", "..")

// ---------------------------------------------------------------------------------------------
// Processes
// ---------------------------------------------------------------------------------------------

interface Serve {
  readonly child: ChildProcess
  readonly exited: Promise<number | null>
  output: string
}

const startServe = (env: Record<string, string>): Serve => {
  const child = spawn(process.execPath, ["--import", "tsx", "src/cli/main.ts", "serve"], {
    cwd: root,
    env: { ...process.env, ...env },
    stdio: ["ignore", "pipe", "pipe"]
  })
  const serve: Serve = {
    child,
    exited: new Promise((resolve) => child.once("exit", (code) => resolve(code))),
    output: ""
  }
  const keep = (chunk: Buffer) => {
    serve.output = (serve.output + chunk.toString()).slice(-8_000)
  }
  child.stdout?.on("data", keep)
  child.stderr?.on("data", keep)
  return serve
}

/** Waits until `count` owners hold live leases on every partition, each its fair share. */
const waitForBalance = async (pool: pg.Pool, count: number, partitions: number, serves: Array<Serve>) => {
  const started = Date.now()
  for (;;) {
    for (const serve of serves) {
      if (serve.child.exitCode !== null) throw new Error(`a serve process exited:\n${serve.output}`)
    }
    try {
      const result = await pool.query<{ owner: string; held: string }>(`
        select owner, count(*)::text as held from quota.partition_owners
        where lease_expires_at > (extract(epoch from clock_timestamp()) * 1000)::bigint group by owner`)
      const counts = result.rows.map((row) => Number(row.held))
      const total = counts.reduce((sum, held) => sum + held, 0)
      const fair = [Math.floor(partitions / count), Math.ceil(partitions / count)]
      if (counts.length === count && total === partitions && counts.every((held) => fair.includes(held)))
        return
    } catch {
      // the schema is not there yet
    }
    if (Date.now() - started > 60_000) {
      throw new Error(
        `partitions not balanced over ${count} processes in 60 s:\n${serves.map((s) => s.output).join("\n")}`
      )
    }
    await sleep(200)
  }
}

// ---------------------------------------------------------------------------------------------
// One run
// ---------------------------------------------------------------------------------------------

interface RunResult {
  readonly processes: number
  readonly round: number
  readonly cyclesPerSecond: number
  readonly requestsPerSecond: number
  readonly p50: number
  readonly p99: number
  readonly errors: number
  readonly firstError: string | undefined
  readonly commandsPerMessage: number
  readonly cpu: CpuShares
}

const runOnce = async (processes: number, round: number): Promise<RunResult> => {
  const tag = randomBytes(4).toString("hex")
  const database = `bench_scaling_${tag}`
  const prefix = `bscale_${tag}`
  const { partitions } = settings
  const dropDatabase = await createDatabase(database)
  const pool = makePool(databaseUrl(database), 2)
  const serves: Array<Serve> = []
  try {
    const env = {
      DATABASE_URL: databaseUrl(database),
      NATS_URL: natsUrl,
      QUOTA_PREFIX: prefix,
      QUOTA_PARTITIONS: String(partitions)
    }
    for (let index = 0; index < processes; index += 1) {
      serves.push(startServe(env))
      // One after the other: the first migrates the schema, the others find it done.
      await waitForBalance(pool, index + 1, partitions, serves)
    }

    const client = await QuotaClient.connect({
      servers: natsUrl,
      prefix,
      partitions,
      timeoutMs: 10_000,
      retry: { attemptsMax: 20 }
    })
    const users = Array.from({ length: settings.users }, (_, index) => `scale-user-${index}`)
    // Load every user's actor first, so the window measures decisions, not first loads.
    for (let start = 0; start < users.length; start += 1_000) {
      await Promise.all(users.slice(start, start + 1_000).map((user) => client.getUsage({ user })))
    }

    let measuring = false
    let running = true
    let cycles = 0
    let errors = 0
    let firstError: string | undefined
    const latency = makeLatencyRecorder()
    const timed = async (call: () => Promise<{ status: string }>, ok: ReadonlyArray<string>) => {
      const started = performance.now()
      try {
        const result = await call()
        if (!ok.includes(result.status)) throw new Error(`answered ${result.status}`)
        if (measuring) latency.recordMs(performance.now() - started)
        return true
      } catch (error) {
        if (measuring) {
          errors += 1
          firstError ??= error instanceof Error ? error.message : String(error)
        }
        return false
      }
    }
    const worker = async (index: number) => {
      const random = makeRng(round * 100_003 + index).next
      for (let sequence = 0; running; sequence += 1) {
        const user = users[Math.floor(random() * users.length)]!
        const id = `${index}-${sequence}`
        const reserved = await timed(
          () => client.reserve({ user, meter: "analysis", amount: 1, id }),
          ["reserved"]
        )
        if (reserved) await timed(() => client.commit({ user, id, amount: 1 }), ["committed"])
        if (measuring && reserved) cycles += 1
      }
    }
    const workers = Promise.all(Array.from({ length: settings.inflight }, (_, index) => worker(index)))
    await sleep(settings.warmupMs)

    const countersBefore = client.counters()
    const cpuMeter = startCpuMeter({ pids: serves.map((serve) => serve.child.pid ?? -1), label: "coord" })
    const started = performance.now()
    measuring = true
    await sleep(settings.measureMs)
    measuring = false
    const seconds = (performance.now() - started) / 1_000
    const cpu = cpuMeter.stop()
    const countersAfter = client.counters()
    running = false
    await workers
    await client.close()

    const { count, p50Ms, p99Ms } = latency.summary()
    const messages = countersAfter.messagesSent - countersBefore.messagesSent
    const commands = countersAfter.commandsSent - countersBefore.commandsSent
    return {
      processes,
      round,
      cyclesPerSecond: cycles / seconds,
      requestsPerSecond: count / seconds,
      p50: p50Ms,
      p99: p99Ms,
      errors,
      firstError,
      commandsPerMessage: messages === 0 ? 0 : commands / messages,
      cpu
    }
  } catch (error) {
    const outputs = serves.map(
      (serve, index) => `--- serve #${index + 1} (exit ${serve.child.exitCode}):\n${serve.output}`
    )
    throw new Error(`${error instanceof Error ? error.message : String(error)}\n${outputs.join("\n")}`)
  } finally {
    for (const serve of serves) if (serve.child.exitCode === null) serve.child.kill("SIGTERM")
    await Promise.race([Promise.all(serves.map((serve) => serve.exited)), sleep(30_000)])
    for (const serve of serves) if (serve.child.exitCode === null) serve.child.kill("SIGKILL")
    await pool.end()
    await dropDatabase()
    await deleteEventsStream(prefix).catch(() => undefined)
  }
}

// ---------------------------------------------------------------------------------------------
// Report
// ---------------------------------------------------------------------------------------------

const format = (value: number, digits = 0): string =>
  Number.isFinite(value) ? value.toLocaleString("en-US", { maximumFractionDigits: digits }) : "-"

const main = async () => {
  const loadBefore = os.loadavg().map((value) => value.toFixed(2))
  const startedAt = new Date()
  const results: Array<RunResult> = []
  for (let round = 1; round <= settings.rounds; round += 1) {
    for (const processes of settings.processes) {
      process.stderr.write(`round ${round}: ${processes} process(es)... `)
      const result = await runOnce(processes, round)
      process.stderr.write(`${format(result.cyclesPerSecond)} cycles/s\n`)
      results.push(result)
    }
  }

  const meanOf = (processes: number) => {
    const runs = results.filter((result) => result.processes === processes)
    return runs.reduce((sum, result) => sum + result.cyclesPerSecond, 0) / runs.length
  }
  const baseline = meanOf(settings.processes[0]!)
  const rows = settings.processes.flatMap((processes) =>
    results
      .filter((result) => result.processes === processes)
      .map(
        (result) =>
          `| ${processes} | ${result.round} | ${format(result.cyclesPerSecond)} | ${format(result.requestsPerSecond)} | ` +
          `${format(result.p50, 1)} | ${format(result.p99, 1)} | ${format(result.commandsPerMessage, 1)} | ` +
          `${result.errors}${result.firstError === undefined ? "" : ` (${result.firstError})`} | ${formatCpu(result.cpu, os.cpus().length)} |`
      )
  )
  const summary = settings.processes.map(
    (processes) =>
      `| ${processes} | ${format(meanOf(processes))} | ${format(meanOf(processes) / baseline, 2)}× |`
  )
  const machine = machineInfo()
  const report = [
    `# Scaling: 1, 2 and 3 coordinator processes, ${startedAt.toISOString().slice(0, 16).replace("T", " ")} UTC`,
    "",
    `Machine: ${machine.cpuModel}, ${machine.cores} cores, ${machine.memoryGiB} GiB, Node ${machine.node}. ` +
      `Code: ${machine.code}. Load average before the runs: ${loadBefore.join(", ")} (1, 5, 15 min).`,
    "Postgres, nats-server, every `serve` process and this bench's client share those cores over loopback.",
    "",
    `Workload: ${settings.inflight} callers in a closed loop through one \`QuotaClient\` (commands coalesced per ` +
      `partition), each cycle a \`reserve\` of 1 on a user drawn uniformly from ${settings.users.toLocaleString("en-US")} ` +
      `then its \`commit\`; P = ${settings.partitions}; every user loaded before the window; ` +
      `${settings.warmupMs / 1_000} s warm-up, ${settings.measureMs / 1_000} s measured; ${settings.rounds} rounds, ` +
      "interleaved. Each run: a fresh database, `serve` processes started one by one until they hold equal shares.",
    "",
    "Columns: *cycles/s* reserve+commit cycles completed in the window; *req/s* requests answered; p50/p99 per " +
      "request in ms (retries included); *cmds/msg* commands per NATS message; *CPU %* of one core while " +
      "measured (bench/lib/cpu.ts): the bench client, the coordinators together, Postgres, nats-server, and " +
      "everything else on the machine.",
    "",
    "| processes | round | cycles/s | req/s | p50 | p99 | cmds/msg | errors | CPU % while measured |",
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ...rows,
    "",
    "| processes | mean cycles/s | vs 1 process |",
    "| --- | --- | --- |",
    ...summary,
    ""
  ].join("\n")
  process.stdout.write(`${report}\n`)
  const file = join(import.meta.dirname, `results-${startedAt.toISOString().slice(0, 10)}.md`)
  writeFileSync(file, report)
  process.stderr.write(`written to ${file}\n`)
}

main().then(
  () => process.exit(0),
  (error: unknown) => {
    process.stderr.write(
      `scaling bench failed: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`
    )
    process.exit(1)
  }
)
