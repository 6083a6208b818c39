/**
 * A Postgres 15 server of the test's own, which it can restart (the machine's shared server must not
 * be): initdb in a temp dir, trust authentication, TCP on 127.0.0.1 only. As the `postgres` user when
 * the tests run as root (initdb refuses root), as test/nemesis/standby.ts runs its pair.
 */
import type { ChildProcess } from "node:child_process"
import { execFile, spawn } from "node:child_process"
import { existsSync } from "node:fs"
import { chmod, chown, mkdtemp, rm, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { promisify } from "node:util"
import pg from "pg"
import { freePort, sleep } from "../support/operations.js"

const binDir = "/usr/lib/postgresql/15/bin"
const execFileAsync = promisify(execFile)
/** How long a start may take, and a fast shutdown before it is killed. */
const startMsMax = 30_000
const stopMsMax = 10_000

export const restartablePostgresAvailable = (): boolean => existsSync(join(binDir, "initdb"))

export interface RestartablePostgres {
  /** A database of its own on the server (serve uses the schema `quota` of its database). */
  readonly url: string
  /**
   * Stops the server and starts it again: fast (SIGINT: sessions ended, a checkpoint) or crash (SIGQUIT:
   * immediate shutdown, no checkpoint, so the start runs crash recovery, as after a power loss).
   */
  readonly restart: (how: "fast" | "crash") => Promise<void>
  readonly stop: () => Promise<void>
}

export const startRestartablePostgres = async (): Promise<RestartablePostgres> => {
  const asRoot = process.getuid?.() === 0
  const ids = asRoot
    ? await Promise.all(
        ["-u", "-g"].map(async (flag) =>
          Number((await execFileAsync("id", [flag, "postgres"])).stdout.trim())
        )
      )
    : undefined
  const asUser = ids === undefined ? {} : { uid: ids[0]!, gid: ids[1]! }
  const dir = await mkdtemp(join(tmpdir(), "quota-restartable-pg-"))
  if (ids !== undefined) await chown(dir, ids[0]!, ids[1]!)
  await chmod(dir, 0o700)
  const dataDir = join(dir, "data")
  const port = await freePort()
  await execFileAsync(
    join(binDir, "initdb"),
    ["-D", dataDir, "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8"],
    { ...asUser, cwd: dir, timeout: startMsMax }
  )
  const conf = join(dataDir, "postgresql.auto.conf")
  await writeFile(
    conf,
    [
      `port = ${port}`,
      "listen_addresses = '127.0.0.1'",
      "unix_socket_directories = ''",
      "shared_buffers = '32MB'",
      ""
    ].join("\n")
  )
  if (ids !== undefined) await chown(conf, ids[0]!, ids[1]!)

  let server: ChildProcess | undefined
  let output = ""
  const start = async () => {
    const child = spawn(join(binDir, "postgres"), ["-D", dataDir], {
      ...asUser,
      stdio: ["ignore", "pipe", "pipe"]
    })
    const append = (chunk: Buffer) => {
      output = (output + chunk.toString()).slice(-200_000)
    }
    child.stdout?.on("data", append)
    child.stderr?.on("data", append)
    server = child
    const until = Date.now() + startMsMax
    for (;;) {
      const client = new pg.Client({ connectionString: `postgres://postgres@127.0.0.1:${port}/postgres` })
      client.on("error", () => {})
      const ready = await client.connect().then(
        () => client.query("select 1").then(() => true),
        () => false
      )
      await client.end().catch(() => undefined)
      if (ready) return
      if (child.exitCode !== null || Date.now() > until) throw new Error(`Postgres did not start:\n${output}`)
      await sleep(50)
    }
  }
  const halt = async (signal: "SIGINT" | "SIGQUIT") => {
    const child = server
    if (child === undefined || child.exitCode !== null || child.signalCode !== null) return
    const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()))
    child.kill(signal)
    const done = await Promise.race([exited.then(() => true), sleep(stopMsMax).then(() => false)])
    if (!done) {
      child.kill("SIGKILL")
      await exited
    }
  }
  await start()
  const admin = new pg.Client({ connectionString: `postgres://postgres@127.0.0.1:${port}/postgres` })
  await admin.connect()
  await admin.query("create database qc_restartable")
  await admin.end()
  return {
    url: `postgres://postgres@127.0.0.1:${port}/qc_restartable`,
    restart: async (how) => {
      await halt(how === "fast" ? "SIGINT" : "SIGQUIT")
      await start()
    },
    stop: async () => {
      await halt("SIGINT")
      await rm(dir, { recursive: true, force: true })
    }
  }
}
