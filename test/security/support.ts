/**
 * Helpers of test/security/secured.test.ts: distinctive secrets, the permission layout of
 * deploy/nats/nats-server.conf rewritten for a test prefix, bounded waits on `serve` child processes
 * (their output in the failure message) and the command line run in this process with its output kept.
 */
import { randomBytes } from "node:crypto"
import { readFile } from "node:fs/promises"
import { join } from "node:path"
import { runCli } from "../../src/cli/cli.js"
import type { ServeProcess } from "../support/processes.js"
import { stopServe } from "../support/processes.js"

/**
 * A secret no log line could hold by accident: `label` and 24 random hex digits. It starts with a
 * letter and holds letters and digits only, so nats-server's config parser, a URL's user info and the
 * shell all take it as it is.
 */
export const secret = (label: string): string => `${label}${randomBytes(12).toString("hex")}`

/** The nkey seed inside a .creds file's text (the block after the user JWT). */
export const credsSeed = (creds: string): string => {
  const seed = /-----BEGIN USER NKEY SEED-----\s+(\S+)/.exec(creds)?.[1]
  if (seed === undefined) throw new Error("no nkey seed in the .creds text")
  return seed
}

/** `url` (a postgres URL) with `password`; trust auth never asks for it, so any value connects. */
export const withPassword = (url: string, password: string): string => {
  const parsed = new URL(url)
  if (parsed.username === "") parsed.username = "postgres"
  parsed.password = password
  return parsed.toString()
}

const replaceLine = (text: string, pattern: RegExp, line: string): string => {
  if (!pattern.test(text)) throw new Error(`deploy/nats/nats-server.conf has no line matching ${pattern}`)
  return text.replace(pattern, line)
}

/**
 * deploy/nats/nats-server.conf for `prefix`: the same users (quota-coordinator, quota-service,
 * quota-operator, passwords from $QUOTA_*_PASSWORD) and permissions, with `quota.v1.` and the stream
 * QUOTA_EVENTS renamed as the file says to, listening on `port` with TLS (`tlsBlock`) and JetStream
 * under `dir`.
 */
export const deployLayoutFor = async (
  prefix: string
): Promise<(port: number, dir: string, tlsBlock: string) => string> => {
  const text = await readFile(new URL("../../deploy/nats/nats-server.conf", import.meta.url), "utf8")
  const stream = `${prefix.toUpperCase().replaceAll(".", "_")}_EVENTS`
  const renamed = text.replaceAll("quota.v1.", `${prefix}.v1.`).replaceAll(".QUOTA_EVENTS", `.${stream}`)
  return (port, dir, tlsBlock) =>
    `${replaceLine(
      replaceLine(renamed, /^listen:.*$/m, `listen: 127.0.0.1:${port}`),
      /^\s*store_dir:.*$/m,
      `  store_dir: "${join(dir, `js-${port}`)}"`
    )}\n${tlsBlock}\n`
}

/** A `tls { ... }` block of a server config: its certificate, and with `ca` clients must show one. */
export const tlsBlock = (cert: string, key: string, ca?: string): string =>
  `tls { cert_file: "${cert}", key_file: "${key}"${ca === undefined ? "" : `, ca_file: "${ca}", verify: true`} }`

const settle = async <T>(
  promise: Promise<T>,
  ms: number
): Promise<{ done: true; value: T } | { done: false }> => {
  let timer: NodeJS.Timeout | undefined
  const timeout = new Promise<{ done: false }>((resolve) => {
    timer = setTimeout(() => resolve({ done: false }), ms)
  })
  try {
    return await Promise.race([promise.then((value) => ({ done: true as const, value })), timeout])
  } finally {
    clearTimeout(timer)
  }
}

/** Waits until `serve` claimed its partitions; throws with its output if it exits or takes over `ms`. */
export const whenReady = async (name: string, serve: ServeProcess, ms = 30_000): Promise<void> => {
  const outcome = await settle(
    Promise.race([serve.ready.then(() => "ready"), serve.exited.then((code) => `exited with ${code}`)]),
    ms
  )
  const what = outcome.done ? outcome.value : `not ready after ${ms} ms`
  if (what !== "ready") throw new Error(`serve (${name}): ${what}; its output:\n${serve.output()}`)
}

/** The exit code of `serve`, which must exit by itself within `ms`; throws with its output if not. */
export const exitCodeWithin = async (
  name: string,
  serve: ServeProcess,
  ms: number
): Promise<number | null> => {
  const outcome = await settle(serve.exited, ms)
  if (!outcome.done)
    throw new Error(`serve (${name}) still runs after ${ms} ms; its output:\n${serve.output()}`)
  return outcome.value
}

/** SIGTERM (serve drains and exits), SIGKILL if it still runs after `ms`. */
export const stop = async (serve: ServeProcess, ms = 15_000): Promise<void> => {
  if (!(await settle(stopServe(serve), ms)).done) {
    serve.child.kill("SIGKILL")
    await serve.exited
  }
}

export interface CliRun {
  readonly code: number
  readonly stdout: string
  readonly stderr: string
}

/**
 * Runs `quota-coordinator ...args` in this process with `env` as its whole environment (nothing of
 * this process's NATS_* leaks in) and keeps what it printed.
 */
export const runCommandLine = async (
  args: ReadonlyArray<string>,
  env: Record<string, string>
): Promise<CliRun> => {
  let stdout = ""
  let stderr = ""
  const code = await runCli(args, {
    env: { ...env },
    stdout: (text) => (stdout += text),
    stderr: (text) => (stderr += text)
  })
  return { code, stdout, stderr }
}

/** The JSON log lines of a serve process's output whose `msg` is `msg`. */
export const logLines = (output: string, msg: string): Array<Record<string, unknown>> =>
  output
    .split("\n")
    .filter((line) => line.startsWith("{"))
    .flatMap((line) => {
      try {
        return [JSON.parse(line) as Record<string, unknown>]
      } catch {
        return [] // a line still being written
      }
    })
    .filter((line) => line["msg"] === msg)
