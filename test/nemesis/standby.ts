/**
 * For runs with `standbyStall`: a Postgres 15 primary of the nemesis's own with one synchronous
 * streaming standby (`synchronous_standby_names = '*'`, `synchronous_commit = on`), the standby
 * reaching the primary through a TCP proxy of test/support/tcpProxy.ts. Silencing that proxy makes the
 * replication link silent: every COMMIT on the primary waits for the standby while reads answer. A
 * COMMIT waiting so is already committed locally: ending its backend (`pg_terminate_backend`) does not
 * roll it back ("the transaction has already committed locally"), it lands.
 *
 * Both servers run as the `postgres` user when the nemesis runs as root (initdb refuses root), in
 * directories it owns under a temp dir; trust authentication, TCP on 127.0.0.1 only, no Unix socket.
 * The nemesis's own sessions (checks, fault switches) commit with `synchronous_commit = local`, so
 * they never wait on the link they silence; the coordinators' sessions commit as the server says.
 */
import type { ChildProcess } from "node:child_process"
import { execFile, spawn } from "node:child_process"
import { existsSync } from "node:fs"
import { chmod, chown, mkdtemp, rm, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { promisify } from "node:util"
import pg from "pg"
import { freePort } from "../support/operations.js"
import type { TestDatabase } from "../support/processes.js"
import type { TcpProxy } from "../support/tcpProxy.js"
import { startTcpProxy } from "../support/tcpProxy.js"
import { sleep } from "../cluster/cluster.js"

const binDir = "/usr/lib/postgresql/15/bin"
const execFileAsync = promisify(execFile)

/** Whether this machine has the Postgres 15 server binaries standbyStall runs (Debian's layout). */
export const standbyAvailable = (): boolean => existsSync(join(binDir, "initdb"))

/** How long a server may take to start, to stop (then it is killed), or the standby to be in sync. */
const startMsMax = 30_000
const stopMsMax = 10_000
/** A server's log is kept up to this many characters (its end). */
const serverLogCharsMax = 4_000_000

export interface StandbyPair {
  readonly dir: string
  /** The primary's database for the run: the coordinators' DATABASE_URL points here (through proxies). */
  readonly database: TestDatabase
  /** The same database on the standby (read-only, in recovery). */
  readonly standbyUrl: string
  /** The standby's replication link: `silence()` stalls every COMMIT on the primary, `resume()` heals. */
  readonly link: TcpProxy
  /** Both servers' logs (the primary's shows the backends ended while they waited for the standby). */
  readonly serverLogs: () => Array<{ readonly name: string; readonly text: string }>
  /** Kills the primary's postmaster (SIGKILL, as a machine lost) and waits for it to be gone. */
  readonly killPrimary: () => Promise<void>
  /**
   * Promotes the standby and makes it commit without a standby of its own (synchronous_standby_names
   * emptied, as Patroni does when the last synchronous standby is gone): resolves once it takes writes.
   * In place (`pg_ctl promote`: the server keeps running), or by restarting it as a primary.
   */
  readonly promoteStandby: (how?: "in place" | "by restart") => Promise<void>
  readonly stop: () => Promise<void>
}

/** The `postgres` user's ids when running as root (initdb refuses root), else this process's own. */
const serverUser = async (): Promise<{ uid: number; gid: number } | undefined> => {
  if (process.getuid?.() !== 0) return undefined
  const [uid, gid] = await Promise.all(
    ["-u", "-g"].map(async (flag) => Number((await execFileAsync("id", [flag, "postgres"])).stdout.trim()))
  )
  return { uid: uid!, gid: gid! }
}

/** The pairs started and not yet stopped: SIGINT or SIGTERM stops them (stopStandbyPairs). */
const livePairs = new Set<() => Promise<void>>()

export const stopStandbyPairs = async (): Promise<void> => {
  await Promise.allSettled([...livePairs].map((stop) => stop()))
}

interface Server {
  readonly child: ChildProcess
  readonly output: () => string
}

export const startStandbyPair = async (): Promise<StandbyPair> => {
  const user = await serverUser()
  const dir = await mkdtemp(join(tmpdir(), "quota-nemesis-pg-"))
  const asUser = user === undefined ? {} : { uid: user.uid, gid: user.gid }
  if (user !== undefined) await chown(dir, user.uid, user.gid)
  await chmod(dir, 0o700)
  const run = (command: string, args: Array<string>) =>
    execFileAsync(join(binDir, command), args, { ...asUser, cwd: dir, timeout: startMsMax })
  const servers: Array<Server> = []
  let link: TcpProxy | undefined
  const stop = async () => {
    livePairs.delete(stop)
    // The standby first, so the primary's shutdown does not wait for its walsender.
    link?.resume()
    for (const server of [...servers].reverse()) await stopServer(server)
    await link?.close()
    await rm(dir, { recursive: true, force: true })
  }
  livePairs.add(stop)
  try {
    const primaryDir = join(dir, "primary")
    const standbyDir = join(dir, "standby")
    const [primaryPort, standbyPort] = [await freePort(), await freePort()]
    await run("initdb", ["-D", primaryDir, "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8"])
    await writeFile(
      join(primaryDir, "postgresql.auto.conf"),
      [
        `port = ${primaryPort}`,
        "listen_addresses = '127.0.0.1'",
        "unix_socket_directories = ''",
        "shared_buffers = '32MB'",
        "max_connections = 100",
        "synchronous_standby_names = '*'",
        "synchronous_commit = on",
        // Longer than any stall: the link's silence is a stall, not a broken replication.
        "wal_sender_timeout = '120s'",
        ""
      ].join("\n")
    )
    if (user !== undefined) await chown(join(primaryDir, "postgresql.auto.conf"), user.uid, user.gid)
    servers.push(startServer(primaryDir, asUser))
    await waitReady(primaryPort, servers[0]!)
    link = await startTcpProxy("127.0.0.1", primaryPort)
    await run("pg_basebackup", [
      "-d",
      `host=127.0.0.1 port=${link.port} user=postgres application_name=nemesis-standby`,
      "-D",
      standbyDir,
      "-R",
      "-X",
      "stream",
      "--no-sync"
    ])
    await execFileAsync(
      "sh",
      [
        "-c",
        `printf "port = ${standbyPort}\\nwal_receiver_timeout = '120s'\\n" >> "${join(standbyDir, "postgresql.auto.conf")}"`
      ],
      asUser
    )
    servers.push(startServer(standbyDir, asUser))
    await waitReady(standbyPort, servers[1]!)
    const adminUrl = `postgres://postgres@127.0.0.1:${primaryPort}/postgres`
    await waitInSync(adminUrl, servers)
    const name = `qc_nemesis_standby`
    const admin = new pg.Client({ connectionString: adminUrl })
    await admin.connect()
    await admin.query(`create database "${name}"`)
    await admin.end()
    const url = `postgres://postgres@127.0.0.1:${primaryPort}/${name}`
    const pool = new pg.Pool({ connectionString: url, max: 4, options: "-c synchronous_commit=local" })
    pool.on("error", () => {})
    const database: TestDatabase = {
      name,
      url,
      pool,
      // The servers go with the pair: the database with them.
      drop: () => pool.end()
    }
    const serverLogs = () =>
      servers.map((server, index) => ({
        name: index === 0 ? "pg-primary" : "pg-standby",
        text: server.output()
      }))
    const standbyUrl = `postgres://postgres@127.0.0.1:${standbyPort}/${name}`
    const killPrimary = async () => {
      const { child } = servers[0]!
      if (child.exitCode !== null || child.signalCode !== null) return
      const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()))
      child.kill("SIGKILL")
      await exited
    }
    const promoteStandby = async (how: "in place" | "by restart" = "in place") => {
      if (how === "in place")
        await run("pg_ctl", ["promote", "-D", standbyDir, "-w", "-t", String(startMsMax / 1_000)])
      else {
        // Started again without standby.signal: it ends recovery at start, a primary whose
        // pg_postmaster_start_time is now (a replaced instance, as some managed failovers give).
        await stopServer(servers[1]!)
        await rm(join(standbyDir, "standby.signal"), { force: true })
        servers[1] = startServer(standbyDir, asUser)
        await waitReady(standbyPort, servers[1])
      }
      // It inherited the primary's settings (pg_basebackup): unchanged, every commit would wait for a
      // synchronous standby it does not have.
      const client = new pg.Client({
        connectionString: `postgres://postgres@127.0.0.1:${standbyPort}/postgres`
      })
      await client.connect()
      try {
        await client.query("alter system set synchronous_standby_names = ''")
        await client.query("select pg_reload_conf()")
        const until = Date.now() + startMsMax
        for (;;) {
          const row = (
            await client.query<{ writable: boolean }>(
              "select not pg_is_in_recovery() and current_setting('synchronous_standby_names') = '' as writable"
            )
          ).rows[0]
          if (row?.writable === true) return
          if (Date.now() > until) throw new Error(`the standby was not promoted:\n${servers[1]!.output()}`)
          await sleep(20)
        }
      } finally {
        await client.end()
      }
    }
    return { dir, database, standbyUrl, link, serverLogs, killPrimary, promoteStandby, stop }
  } catch (error) {
    await stop()
    throw error
  }
}

const startServer = (dataDir: string, asUser: { uid?: number; gid?: number }): Server => {
  const child = spawn(join(binDir, "postgres"), ["-D", dataDir], {
    ...asUser,
    stdio: ["ignore", "pipe", "pipe"]
  })
  let output = ""
  const append = (chunk: Buffer) => {
    output = (output + chunk.toString()).slice(-serverLogCharsMax)
  }
  child.stdout?.on("data", append)
  child.stderr?.on("data", append)
  return { child, output: () => output }
}

/** Fast shutdown (SIGINT), then SIGKILL if it takes longer than stopMsMax. */
const stopServer = async (server: Server): Promise<void> => {
  const { child } = server
  if (child.exitCode !== null || child.signalCode !== null) return
  const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()))
  child.kill("SIGINT")
  const done = await Promise.race([exited.then(() => true), sleep(stopMsMax).then(() => false)])
  if (!done) {
    child.kill("SIGKILL")
    await exited
  }
}

const waitReady = async (port: number, server: Server): Promise<void> => {
  const until = Date.now() + startMsMax
  for (;;) {
    const ready = await execFileAsync(join(binDir, "pg_isready"), [
      "-h",
      "127.0.0.1",
      "-p",
      String(port)
    ]).then(
      () => true,
      () => false
    )
    if (ready) return
    if (server.child.exitCode !== null || Date.now() > until)
      throw new Error(`Postgres on port ${port} did not start:\n${server.output()}`)
    await sleep(100)
  }
}

/** Until the primary names the standby synchronous: commits wait for it from then on. */
const waitInSync = async (adminUrl: string, servers: ReadonlyArray<Server>): Promise<void> => {
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
