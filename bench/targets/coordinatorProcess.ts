/**
 * Starts the coordinator as the deployment runs it: `quota-coordinator serve` (src/cli/main.ts, through
 * tsx) in its own process, on a fresh database created for this bench run and dropped after, with a
 * random subject prefix and the bench's meters-and-plans file. Stopped with SIGTERM (it drains).
 */
import type { ChildProcess } from "node:child_process"
import { spawn } from "node:child_process"
import { randomBytes } from "node:crypto"
import { createWriteStream } from "node:fs"
import { mkdtemp, rm, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { connect } from "@nats-io/transport-node"
import { partitionOf } from "../../src/domain/partition.js"
import { setTimeout as sleep } from "node:timers/promises"
import { createDatabase, databaseUrl } from "./pgCommon.js"
import { meterLimits, slotsPerUser } from "./Target.js"
import { deleteEventsStream, natsUrl } from "./natsTarget.js"

/** The bench's meters and plans: `work` (never reached), `hot` (tight), slots for the mix. */
const benchConfig = {
  meters: { work: { period: "month" }, hot: { period: "month" } },
  plans: { free: { slots: slotsPerUser, limits: { work: meterLimits.work, hot: meterLimits.hot } } },
  defaultPlan: "free"
}

export interface CoordinatorProcess {
  readonly prefix: string
  readonly partitions: number
  readonly database: string
  readonly pid: number
  /** The last lines it wrote to stderr/stdout (for the report when something failed). */
  readonly output: () => string
  readonly stop: () => Promise<void>
}

const startTimeoutMs = 60_000
const probeUser = "bench-probe"

/**
 * `env` is laid over the bench's own settings (a variant, e.g. `QUOTA_HTTP_ADDR=off`). By default the
 * coordinator runs as deployed: its /metrics endpoint on (on a port the OS picks).
 */
export const startCoordinator = async (
  root: string,
  env: Readonly<Record<string, string>> = {},
  partitions = 64
): Promise<CoordinatorProcess> => {
  const tag = randomBytes(4).toString("hex")
  const prefix = `bench_${tag}`
  const database = `bench_quota_${tag}`
  const dropDatabase = await createDatabase(database)
  const directory = await mkdtemp(join(tmpdir(), "quota-bench-"))
  const configPath = join(directory, "config.json")
  await writeFile(configPath, JSON.stringify(benchConfig))

  let output = ""
  // BENCH_COORDINATOR_NODE_FLAGS (e.g. "--cpu-prof --cpu-prof-dir=/tmp/prof") profiles the coordinator
  // alone; set in `env` (a variant), it replaces the flags as deployed (`npm run serve`, the Dockerfile:
  // a 64 MB young generation, see docs/PERFORMANCE.md), so `BENCH_COORDINATOR_NODE_FLAGS=` is Node's default.
  const nodeFlags = (
    env["BENCH_COORDINATOR_NODE_FLAGS"] ??
    `--max-semi-space-size=64 ${process.env["BENCH_COORDINATOR_NODE_FLAGS"] ?? ""}`
  )
    .split(" ")
    .filter((flag) => flag !== "")
  const child: ChildProcess = spawn(
    process.execPath,
    [...nodeFlags, "--import", "tsx", "src/cli/main.ts", "serve"],
    {
      cwd: root,
      env: {
        ...process.env,
        DATABASE_URL: databaseUrl(database),
        NATS_URL: natsUrl,
        QUOTA_PREFIX: prefix,
        QUOTA_PARTITIONS: String(partitions),
        QUOTA_CONFIG: configPath,
        QUOTA_HTTP_ADDR: "127.0.0.1:0",
        ...env
      },
      stdio: ["ignore", "pipe", "pipe"]
    }
  )
  // BENCH_COORDINATOR_OUTPUT=<file> copies all it writes there (e.g. with --trace-gc in the flags above).
  const copyPath = process.env["BENCH_COORDINATOR_OUTPUT"]
  const copy = copyPath === undefined || copyPath === "" ? undefined : createWriteStream(copyPath)
  // V8's GC trace counts ms from the isolate's start; this lines it up with wall clock (within ~50 ms).
  copy?.write(`# coordinator spawned at ${Date.now()} (wall clock, ms)\n`)
  const keep = (chunk: Buffer) => {
    output = (output + chunk.toString()).slice(-4000)
    copy?.write(chunk)
  }
  child.stdout?.on("data", keep)
  child.stderr?.on("data", keep)
  let exited = false
  const exitedPromise = new Promise<void>((resolve) =>
    child.once("exit", () => {
      exited = true
      resolve()
    })
  )

  const cleanup = async () => {
    if (!exited && child.pid !== undefined) {
      child.kill("SIGTERM")
      await Promise.race([exitedPromise, sleep(30_000)])
      if (!exited) child.kill("SIGKILL")
    }
    copy?.end()
    await rm(directory, { recursive: true, force: true })
    await dropDatabase().catch(() => undefined)
    await deleteEventsStream(prefix).catch(() => undefined)
  }

  // Ready when an admin get_usage is answered (a no-responders rejection means not yet).
  const nc = await connect({ servers: natsUrl, name: "bench-coordinator-probe" })
  try {
    const started = Date.now()
    for (;;) {
      if (exited) throw new Error(`the coordinator exited during start:\n${output}`)
      if (Date.now() - started > startTimeoutMs)
        throw new Error(`the coordinator did not answer within ${startTimeoutMs} ms:\n${output}`)
      try {
        const subject = `${prefix}.v1.${partitionOf(probeUser, partitions)}.admin`
        const reply = await nc.request(subject, JSON.stringify({ op: "get_usage", user: probeUser }), {
          timeout: 2_000
        })
        const result = reply.json<{ status?: string }>()
        if (result.status === "ok") break
      } catch {
        // not serving yet
      }
      await sleep(200)
    }
  } catch (error) {
    await nc.close()
    await cleanup()
    throw error
  }
  await nc.close()

  return {
    prefix,
    partitions,
    database,
    pid: child.pid ?? -1,
    output: () => output,
    stop: cleanup
  }
}
