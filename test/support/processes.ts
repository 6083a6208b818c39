/**
 * Real coordinator processes for crash and cluster tests: each `serve` is a child process running the
 * CLI, against a database of its own test file and a random subject prefix on this machine's NATS.
 */
import { spawn } from "node:child_process"
import type { ChildProcess } from "node:child_process"
import { randomUUID } from "node:crypto"
import { once } from "node:events"
import pg from "pg"
import { compiledServeArguments } from "./compiledServe.js"
import { testServeEnv } from "./eventStreams.js"

const adminUrl = process.env["DATABASE_URL"] ?? "postgres://postgres@127.0.0.1:5432/test"

export interface TestDatabase {
  readonly name: string
  readonly url: string
  readonly pool: pg.Pool
  readonly drop: () => Promise<void>
}

/** A fresh database (serve uses the schema `quota` of its database, so process tests get their own). */
export const createTestDatabase = async (label: string): Promise<TestDatabase> => {
  const name = `qc_${label}_${randomUUID().replaceAll("-", "").slice(0, 10)}`
  const admin = new pg.Client({ connectionString: adminUrl })
  await admin.connect()
  await admin.query(`create database "${name}"`)
  await admin.end()
  const url = new URL(adminUrl)
  url.pathname = `/${name}`
  const pool = new pg.Pool({ connectionString: url.toString(), max: 4 })
  pool.on("error", () => {})
  return {
    name,
    url: url.toString(),
    pool,
    drop: async () => {
      await pool.end()
      const cleanup = new pg.Client({ connectionString: adminUrl })
      await cleanup.connect()
      await cleanup.query(`drop database if exists "${name}" with (force)`)
      await cleanup.end()
    }
  }
}

export interface ServeProcess {
  readonly child: ChildProcess
  /** Resolves when the process logged that it serves (claimed partitions or serving all). */
  readonly ready: Promise<void>
  /** Everything it wrote, for a failure message. */
  readonly output: () => string
  readonly exited: Promise<number | null>
  /** The port of its /metrics, /healthz, /readyz (it binds any free one), once it logged it. */
  readonly httpPort: () => number | undefined
}

/** `readyWhen`: a log message that means serving; default the first claim of partitions. */
export const startServe = (env: Record<string, string>, readyWhen = "claimed partitions"): ServeProcess => {
  // Compiled by the global setup (buildServe.ts): started as deployed, not through tsx.
  const child = spawn(process.execPath, [...compiledServeArguments], {
    // Several processes run at once: each binds any free port for its HTTP endpoint, and logs it.
    env: { ...process.env, LOG_LEVEL: "info", QUOTA_HTTP_ADDR: "127.0.0.1:0", ...testServeEnv, ...env },
    stdio: ["ignore", "pipe", "pipe"]
  })
  let output = ""
  let markReady: () => void = () => {}
  const ready = new Promise<void>((resolve) => {
    markReady = resolve
  })
  const onData = (chunk: Buffer) => {
    output += chunk.toString()
    if (output.includes(`"msg":"${readyWhen}"`)) markReady()
  }
  child.stdout?.on("data", onData)
  child.stderr?.on("data", onData)
  const exited = once(child, "exit").then(([code]) => code as number | null)
  const httpPort = () => {
    const match = /"address":"127\.0\.0\.1:(\d+)","msg":"operations http listening/.exec(output)
    return match === null ? undefined : Number(match[1])
  }
  return { child, ready, output: () => output, exited, httpPort }
}

export const stopServe = async (
  serve: ServeProcess,
  signal: NodeJS.Signals = "SIGTERM"
): Promise<number | null> => {
  if (serve.child.exitCode !== null || serve.child.signalCode !== null) return serve.child.exitCode
  serve.child.kill(signal)
  return serve.exited
}

export const randomPrefix = (label: string): string =>
  `t${label}${randomUUID().replaceAll("-", "").slice(0, 8)}`
