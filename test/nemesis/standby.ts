/**
 * A Postgres 15 primary of the nemesis's own with one synchronous streaming standby
 * (`synchronous_standby_names = '*'`, `synchronous_commit = on`), the standby reaching the primary
 * through a TCP proxy of test/support/tcpProxy.ts (the link). Silencing the link makes the replication
 * silent: every COMMIT on the primary waits for the standby while reads answer. A COMMIT waiting so is
 * already committed locally: ending its backend (`pg_terminate_backend`) does not roll it back ("the
 * transaction has already committed locally"), it lands, on the primary only.
 *
 * The pair fails over as an operator or Patroni would: the primary lost (its whole process group
 * killed), the standby promoted in place or by a restart, and (for a world that goes on) a new standby
 * made from the new primary where the old one was, synchronous again. The primary can also be
 * restarted in place (a crash or a fast shutdown). Roles move: `primaryPort()` says where the primary
 * is now; `database` and `standbyUrl` name the first roles' servers.
 *
 * Both servers run as the `postgres` user when the nemesis runs as root (initdb refuses root), in
 * directories it owns under a temp dir; trust authentication, TCP on 127.0.0.1 only, no Unix socket.
 * The nemesis's own sessions (checks, fault switches) commit with `synchronous_commit = local`, so
 * they never wait on the link they silence; the coordinators' sessions commit as the server says.
 */
import { chmod, chown, mkdtemp, rm, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import pg from "pg"
import { freePort } from "../support/operations.js"
import type { TestDatabase } from "../support/processes.js"
import type { TcpProxy } from "../support/tcpProxy.js"
import { startTcpProxy } from "../support/tcpProxy.js"
import { sleep } from "../cluster/cluster.js"
import type { Server } from "./postgresServer.js"
import {
  adminQuery,
  binDir,
  crashServer,
  execFileAsync,
  isUp,
  postgresServerAvailable,
  serverUser,
  startMsMax,
  startServer,
  stopServer,
  waitInSync,
  waitReady
} from "./postgresServer.js"

/** Whether this machine has the Postgres 15 server binaries the pair runs (Debian's layout). */
export const standbyAvailable = postgresServerAvailable

/** The database the coordinators use on the pair. */
const databaseName = "qc_nemesis_standby"

export interface StandbyPairOptions {
  /**
   * Added to both servers' environment: libfaketime's (LD_PRELOAD, FAKETIME...), for a world whose
   * clocks are all set elsewhere in time (a month's end), Postgres's included.
   */
  readonly env?: Record<string, string>
}

export interface StandbyPair {
  readonly dir: string
  /** The first primary's database (its pool commits with synchronous_commit = local). */
  readonly database: TestDatabase
  /** The same database on the first standby (read-only, in recovery). */
  readonly standbyUrl: string
  /** The standby's replication link: `silence()` stalls every COMMIT on the primary, `resume()` heals. */
  readonly link: TcpProxy
  /** Every server's log, each incarnation (the primary's shows the backends ended while they waited). */
  readonly serverLogs: () => Array<{ readonly name: string; readonly text: string }>
  /** Where the primary is now (it moves with a promotion). */
  readonly primaryPort: () => number
  /** Kills the primary's process group (SIGKILL, as a machine lost) and waits for it to be gone. */
  readonly killPrimary: () => Promise<void>
  /**
   * Promotes the standby and makes it commit without a standby of its own (synchronous_standby_names
   * emptied, as Patroni does when the last synchronous standby is gone): resolves once it takes writes.
   * In place (`pg_ctl promote`: the server keeps running), or by restarting it as a primary.
   */
  readonly promoteStandby: (how?: "in place" | "by restart") => Promise<void>
  /**
   * After a promotion: a new standby made from the new primary (pg_basebackup through the link) in the
   * lost primary's place, and the primary synchronous again once it streams. Resolves when in sync.
   */
  readonly rebuildStandby: () => Promise<void>
  /**
   * The primary stopped (a crash of its process group, or a fast shutdown), then started again on the
   * same directory and port after `downMs`; resolves once it accepts connections. The standby
   * reconnects by itself (within `wal_retrieve_retry_interval`, 1 s here); until then commits wait.
   */
  readonly restartPrimary: (how: "crash" | "fast", downMs: number) => Promise<void>
  readonly stop: () => Promise<void>
}

/** The pairs started and not yet stopped: SIGINT or SIGTERM stops them (stopStandbyPairs). */
const livePairs = new Set<() => Promise<void>>()

export const stopStandbyPairs = async (): Promise<void> => {
  await Promise.allSettled([...livePairs].map((stop) => stop()))
}

/** A server slot of the pair: its directory and port stay, its process changes with each start. */
interface Node {
  readonly name: string
  readonly dataDir: string
  readonly port: number
  /** Its latest process; undefined before its first start. */
  server: Server | undefined
  incarnations: number
}

const serverOf = (node: Node): Server => {
  if (node.server === undefined) throw new Error(`${node.name} was never started`)
  return node.server
}

export const startStandbyPair = async (options: StandbyPairOptions = {}): Promise<StandbyPair> => {
  const asUser = await serverUser()
  const env = options.env ?? {}
  const dir = await mkdtemp(join(tmpdir(), "quota-nemesis-pg-"))
  if (asUser.uid !== undefined) await chown(dir, asUser.uid, asUser.gid!)
  await chmod(dir, 0o700)
  const run = (command: string, args: Array<string>) =>
    execFileAsync(join(binDir, command), args, { ...asUser, cwd: dir, timeout: startMsMax })
  const servers: Array<Server & { readonly name: string }> = []
  const start = (node: Node): Server => {
    const server = startServer(node.dataDir, node.port, asUser, env)
    servers.push({
      ...server,
      name: node.incarnations === 0 ? node.name : `${node.name}-${node.incarnations}`
    })
    node.incarnations += 1
    node.server = server
    return server
  }
  let link: TcpProxy | undefined
  const roles: { primary?: Node; standby?: Node } = {}
  const stop = async () => {
    livePairs.delete(stop)
    // The standby first, so the primary's shutdown does not wait for its walsender.
    link?.resume()
    for (const node of [roles.standby, roles.primary])
      if (node?.server !== undefined) await stopServer(node.server)
    await link?.close()
    await rm(dir, { recursive: true, force: true })
  }
  livePairs.add(stop)

  /** pg_basebackup of the primary (through the link) into `node`'s directory, started as a standby. */
  const makeStandby = async (node: Node): Promise<void> => {
    await run("pg_basebackup", [
      "-d",
      `host=127.0.0.1 port=${link!.port} user=postgres application_name=nemesis-standby`,
      ...["-D", node.dataDir, "-R", "-X", "stream", "--no-sync"],
      // Not a spread checkpoint: right after a promotion one is running, and a spread one takes minutes.
      "--checkpoint=fast"
    ])
    const settings = [
      `port = ${node.port}`,
      "wal_receiver_timeout = '120s'",
      // A restarted primary is found again within a second (the default waits 5 s, every commit with it).
      "wal_retrieve_retry_interval = '1s'",
      // It was the primary's: a standby promoted later names its own standbys again when one is made.
      "synchronous_standby_names = ''"
    ]
    await execFileAsync(
      "sh",
      ["-c", `printf "${settings.join("\\n")}\\n" >> "${join(node.dataDir, "postgresql.auto.conf")}"`],
      asUser
    )
    await waitReady(start(node))
  }

  try {
    const [primaryPort, standbyPort] = [await freePort(), await freePort()]
    const primary: Node = {
      name: "pg-primary",
      dataDir: join(dir, "primary"),
      port: primaryPort,
      server: undefined,
      incarnations: 0
    }
    await run("initdb", ["-D", primary.dataDir, "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8"])
    await writeFile(
      join(primary.dataDir, "postgresql.auto.conf"),
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
        // A standby rebuilt after a promotion connects as a replication client of the new primary.
        "wal_level = replica",
        ""
      ].join("\n")
    )
    if (asUser.uid !== undefined)
      await chown(join(primary.dataDir, "postgresql.auto.conf"), asUser.uid, asUser.gid!)
    roles.primary = primary
    await waitReady(start(primary))
    link = await startTcpProxy("127.0.0.1", primaryPort)
    const standby: Node = {
      name: "pg-standby",
      dataDir: join(dir, "standby"),
      port: standbyPort,
      server: undefined,
      incarnations: 0
    }
    roles.standby = standby
    await makeStandby(standby)
    const adminUrl = `postgres://postgres@127.0.0.1:${primaryPort}/postgres`
    await waitInSync(adminUrl, servers)
    await adminQuery(primaryPort, `create database "${databaseName}"`)
    const url = `postgres://postgres@127.0.0.1:${primaryPort}/${databaseName}`
    const pool = new pg.Pool({ connectionString: url, max: 4, options: "-c synchronous_commit=local" })
    pool.on("error", () => {})
    // The servers go with the pair: the database with them.
    const database: TestDatabase = { name: databaseName, url, pool, drop: () => pool.end() }
    const serverLogs = () => servers.map((server) => ({ name: server.name, text: server.output() }))
    const standbyUrl = `postgres://postgres@127.0.0.1:${standbyPort}/${databaseName}`

    const killPrimary = () => crashServer(serverOf(roles.primary!))

    const promoteStandby = async (how: "in place" | "by restart" = "in place") => {
      const node = roles.standby
      if (node === undefined) throw new Error("no standby to promote")
      if (how === "in place")
        await run("pg_ctl", ["promote", "-D", node.dataDir, "-w", "-t", String(startMsMax / 1_000)])
      else {
        // Started again without standby.signal: it ends recovery at start, a primary whose
        // pg_postmaster_start_time is now (a replaced instance, as some managed failovers give).
        await stopServer(serverOf(node))
        await rm(join(node.dataDir, "standby.signal"), { force: true })
        await waitReady(start(node))
      }
      // Unchanged, every commit would wait for a synchronous standby it does not have.
      await adminQuery(
        node.port,
        "alter system set synchronous_standby_names = ''",
        "select pg_reload_conf()"
      )
      const client = new pg.Client({
        connectionString: `postgres://postgres@127.0.0.1:${node.port}/postgres`
      })
      await client.connect()
      try {
        const until = Date.now() + startMsMax
        for (;;) {
          const row = (
            await client.query<{ writable: boolean }>(
              "select not pg_is_in_recovery() and current_setting('synchronous_standby_names') = '' as writable"
            )
          ).rows[0]
          if (row?.writable === true) break
          if (Date.now() > until) throw new Error(`the standby was not promoted:\n${serverOf(node).output()}`)
          await sleep(20)
        }
      } finally {
        await client.end()
      }
      // The lost primary's slot is where the next standby goes.
      const lost = roles.primary!
      roles.primary = node
      roles.standby = lost
      link!.retarget(node.port)
    }

    const rebuildStandby = async () => {
      const node = roles.standby
      if (node === undefined || (node.server !== undefined && isUp(node.server))) return
      await rm(node.dataDir, { recursive: true, force: true })
      await makeStandby(node)
      const primaryNow = roles.primary!
      await adminQuery(
        primaryNow.port,
        "alter system set synchronous_standby_names = '*'",
        "select pg_reload_conf()"
      )
      await waitInSync(`postgres://postgres@127.0.0.1:${primaryNow.port}/postgres`, servers)
    }

    const restartPrimary = async (how: "crash" | "fast", downMs: number) => {
      const node = roles.primary!
      if (how === "crash") await crashServer(serverOf(node))
      else await stopServer(serverOf(node))
      await sleep(downMs)
      await waitReady(start(node))
    }

    return {
      dir,
      database,
      standbyUrl,
      link,
      serverLogs,
      primaryPort: () => roles.primary!.port,
      killPrimary,
      promoteStandby,
      rebuildStandby,
      restartPrimary,
      stop
    }
  } catch (error) {
    await stop()
    throw error
  }
}
