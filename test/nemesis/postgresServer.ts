/**
 * One Postgres 15 server of the nemesis's own (test/nemesis/standby.ts makes a primary and a
 * synchronous standby of two): started from a data directory as the `postgres` user when the runner is
 * root (initdb refuses root), in a process group of its own, so a crash takes every backend with the
 * postmaster, as a machine lost does (a SIGKILL of the postmaster alone leaves its backends running
 * until they notice, and a restart on the same directory then refuses to start).
 */
import type { ChildProcess } from "node:child_process"
import { execFile, spawn } from "node:child_process"
import { existsSync } from "node:fs"
import { join } from "node:path"
import { promisify } from "node:util"
import pg from "pg"
import { sleep } from "../cluster/cluster.js"

export const binDir = "/usr/lib/postgresql/15/bin"
export const execFileAsync = promisify(execFile)

/** Whether this machine has the Postgres 15 server binaries (Debian's layout). */
export const postgresServerAvailable = (): boolean => existsSync(join(binDir, "initdb"))

/** How long a server may take to start, to stop (then it is killed), or a standby to be in sync. */
export const startMsMax = 30_000
const stopMsMax = 10_000
/** A server's log is kept up to this many characters (its end). */
const serverLogCharsMax = 4_000_000

/** The ids the servers run as: the `postgres` user's when running as root, else this process's own. */
export type ServerUser = { readonly uid?: number; readonly gid?: number }

export const serverUser = async (): Promise<ServerUser> => {
  if (process.getuid?.() !== 0) return {}
  const [uid, gid] = await Promise.all(
    ["-u", "-g"].map(async (flag) => Number((await execFileAsync("id", [flag, "postgres"])).stdout.trim()))
  )
  return { uid: uid!, gid: gid! }
}

export interface Server {
  readonly dataDir: string
  readonly port: number
  readonly child: ChildProcess
  readonly output: () => string
}

export const isUp = (server: Server): boolean =>
  server.child.exitCode === null && server.child.signalCode === null

/**
 * Starts `postgres -D dataDir` (its port is in the directory's postgresql.auto.conf); `env` is added to
 * the server's environment (libfaketime's, for a world whose clocks are set elsewhere in time).
 */
export const startServer = (
  dataDir: string,
  port: number,
  asUser: ServerUser,
  env: Record<string, string> = {}
): Server => {
  const child = spawn(join(binDir, "postgres"), ["-D", dataDir], {
    ...asUser,
    env: { ...process.env, ...env },
    detached: true,
    stdio: ["ignore", "pipe", "pipe"]
  })
  let output = ""
  const append = (chunk: Buffer) => {
    output = (output + chunk.toString()).slice(-serverLogCharsMax)
  }
  child.stdout?.on("data", append)
  child.stderr?.on("data", append)
  return { dataDir, port, child, output: () => output }
}

const exitOf = (child: ChildProcess): Promise<void> =>
  child.exitCode !== null || child.signalCode !== null
    ? Promise.resolve()
    : new Promise<void>((resolve) => child.once("exit", () => resolve()))

/** SIGKILL to the server's whole process group (postmaster and backends): a machine lost. */
export const crashServer = async (server: Server): Promise<void> => {
  if (!isUp(server) || server.child.pid === undefined) return
  const exited = exitOf(server.child)
  try {
    process.kill(-server.child.pid, "SIGKILL")
  } catch {
    server.child.kill("SIGKILL")
  }
  await exited
  // The backends of the group may outlive the postmaster by a moment; the port is free once they go.
  await sleep(100)
}

/** Fast shutdown (SIGINT), then a crash if it takes longer than stopMsMax. */
export const stopServer = async (server: Server): Promise<void> => {
  if (!isUp(server)) return
  const exited = exitOf(server.child)
  server.child.kill("SIGINT")
  const done = await Promise.race([exited.then(() => true), sleep(stopMsMax).then(() => false)])
  if (!done) await crashServer(server)
}

export const waitReady = async (server: Server): Promise<void> => {
  const until = Date.now() + startMsMax
  for (;;) {
    const ready = await execFileAsync(join(binDir, "pg_isready"), [
      "-h",
      "127.0.0.1",
      "-p",
      String(server.port)
    ]).then(
      () => true,
      () => false
    )
    if (ready) return
    if (!isUp(server) || Date.now() > until)
      throw new Error(`Postgres on port ${server.port} did not start:\n${server.output()}`)
    await sleep(100)
  }
}

/** Until the primary names a standby synchronous: commits wait for it from then on. */
export const waitInSync = async (adminUrl: string, servers: ReadonlyArray<Server>): Promise<void> => {
  const client = new pg.Client({ connectionString: adminUrl })
  await client.connect()
  try {
    const until = Date.now() + startMsMax
    for (;;) {
      const result = await client.query<{ state: string }>(
        "select sync_state as state from pg_stat_replication where sync_state = 'sync'"
      )
      if (result.rows.length > 0) return
      if (Date.now() > until)
        throw new Error(`the standby never became synchronous:\n${servers.map((s) => s.output()).join("\n")}`)
      await sleep(100)
    }
  } finally {
    await client.end()
  }
}

/** Runs statements on a server's `postgres` database, as the superuser, then disconnects. */
export const adminQuery = async (port: number, ...statements: ReadonlyArray<string>): Promise<void> => {
  const client = new pg.Client({ connectionString: `postgres://postgres@127.0.0.1:${port}/postgres` })
  await client.connect()
  try {
    for (const statement of statements) await client.query(statement)
  } finally {
    await client.end()
  }
}
