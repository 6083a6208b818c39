/**
 * What the nemesis runs against: a nats-server of its own (JetStream, the deployed ping settings), a
 * fresh database, and three `serve` processes (the compiled build), each reaching NATS and Postgres
 * through TCP proxies of its own (so one process at a time can be cut off), with its own
 * application_name (so its sessions can be found in pg_stat_activity) and, where libfaketime is
 * installed, a wall clock the nemesis can shift (performance.now is left alone).
 *
 * A deferred trigger on every table a write touches sleeps in COMMIT when the switch table says so for
 * the writing process (as test/store/unknownOutcome.test.ts does for one hold): with the processes'
 * short store query timeout, those commits end with an outcome unknown to the process.
 */
import { existsSync, readdirSync, readFileSync } from "node:fs"
import { mkdtemp, rm, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import type { NatsServerProcess } from "../support/natsServerProcess.js"
import { startNatsServer } from "../support/natsServerProcess.js"
import type { ServeProcess, TestDatabase } from "../support/processes.js"
import { createTestDatabase, randomPrefix, startServe, stopServe } from "../support/processes.js"
import type { TcpProxy } from "../support/tcpProxy.js"
import { startTcpProxy } from "../support/tcpProxy.js"
import { logEntries, startCluster } from "../cluster/cluster.js"
import { slotLimit } from "../cluster/flows.js"
import type { StandbyPair } from "./standby.js"
import { startStandbyPair, stopStandbyPairs } from "./standby.js"

export const libfaketimePath = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
export const faketimeAvailable = (): boolean => existsSync(libfaketimePath)

export interface NemesisMember {
  readonly index: number
  readonly app: string
  readonly env: Record<string, string>
  readonly nats: TcpProxy
  readonly postgres: TcpProxy
  /** libfaketime reads its offset from here (FAKETIME_TIMESTAMP_FILE); undefined without libfaketime. */
  readonly clockFile: string | undefined
  /** Every process started for this member, the latest last (a kill starts a new one). */
  readonly incarnations: Array<ServeProcess>
}

export const currentServe = (member: NemesisMember): ServeProcess => member.incarnations.at(-1)!

export const isRunning = (serve: ServeProcess): boolean =>
  serve.child.exitCode === null && serve.child.signalCode === null

/** The owner id of a process, once it logged that it serves. */
export const ownerOfServe = (serve: ServeProcess): string | undefined => {
  const owner = logEntries(serve).find((entry) => entry.msg === "serving")?.["owner"]
  return typeof owner === "string" ? owner : undefined
}

export interface NemesisWorld {
  readonly dir: string
  readonly nats: NatsServerProcess
  readonly database: TestDatabase
  readonly prefix: string
  readonly partitions: number
  readonly queryTimeoutMs: number
  readonly members: ReadonlyArray<NemesisMember>
  /** With standbyStall: the nemesis's own primary and its synchronous standby (else the shared server). */
  readonly standby: StandbyPair | undefined
  /** Set when closeWorld begins: the processes' ends from then on are the nemesis's own. */
  readonly closing: { value: boolean }
}

export interface WorldOptions {
  readonly members: number
  readonly partitions: number
  readonly leaseMs: number
  /** The processes' QUOTA_STORE_QUERY_TIMEOUT: a commit sleeping longer is of unknown outcome. */
  readonly queryTimeoutMs: number
  readonly clock: boolean
  /** A primary of its own with a synchronous standby whose link can go silent (standbyStall). */
  readonly standby: boolean
}

/** The switch and the sleeping trigger (see the file's comment); `quota`'s tables exist by then. */
const doubtSql = (tables: ReadonlyArray<string>) => `
  create schema nemesis;
  create table nemesis.doubts (
    app text primary key, probability float8 not null, sleep_ms integer not null, stall_until timestamptz
  );
  create function nemesis.sleep_in_commit() returns trigger language plpgsql as $$
  declare
    doubt record;
  begin
    -- Once per transaction: the first row's trigger decides for the whole COMMIT.
    if current_setting('nemesis.decided', true) = 'yes' then return null; end if;
    perform set_config('nemesis.decided', 'yes', true);
    select * into doubt from nemesis.doubts where app = current_setting('application_name');
    if found and doubt.stall_until is not null then
      perform pg_sleep(greatest(0, extract(epoch from doubt.stall_until - clock_timestamp())));
    elsif found and random() < doubt.probability then
      perform pg_sleep(doubt.sleep_ms / 1000.0);
    end if;
    return null;
  end $$;
  ${tables
    .map(
      (table) => `create constraint trigger nemesis_sleep_in_commit
        after insert or update or delete on quota.${table} deferrable initially deferred
        for each row execute function nemesis.sleep_in_commit();`
    )
    .join("\n")}`

export const openWorld = async (options: WorldOptions): Promise<NemesisWorld> => {
  const dir = await mkdtemp(join(tmpdir(), "quota-nemesis-"))
  const nats = await startNatsServer(
    dir,
    (port) =>
      `listen: 127.0.0.1:${port}\nping_interval: "1s"\nping_max: 2\n` +
      `jetstream { store_dir: "${join(dir, "js")}" }\n`
  )
  const standby = options.standby ? await startStandbyPair() : undefined
  const database = standby?.database ?? (await createTestDatabase("nemesis"))
  const prefix = randomPrefix("nem")
  const members: Array<NemesisMember> = []
  for (let index = 0; index < options.members; index += 1) {
    const natsProxy = await startTcpProxy("127.0.0.1", nats.port)
    const postgresProxy = await startTcpProxy("127.0.0.1", Number(new URL(database.url).port || 5432))
    const app = `nemesis-m${index}`
    const url = new URL(database.url)
    url.port = String(postgresProxy.port)
    url.searchParams.set("application_name", app)
    let clockFile: string | undefined
    let clockEnv: Record<string, string> = {}
    if (options.clock) {
      clockFile = join(dir, `clock-${index}`)
      await writeFile(clockFile, "+0\n")
      clockEnv = {
        LD_PRELOAD: libfaketimePath,
        FAKETIME_TIMESTAMP_FILE: clockFile,
        // Read again at most every second; the monotonic clock (performance.now) is left true.
        FAKETIME_CACHE_DURATION: "1",
        FAKETIME_DONT_FAKE_MONOTONIC: "1"
      }
    }
    const env = {
      DATABASE_URL: url.toString(),
      NATS_URL: `nats://127.0.0.1:${natsProxy.port}`,
      QUOTA_PREFIX: prefix,
      QUOTA_PARTITIONS: String(options.partitions),
      QUOTA_LEASE_MS: String(options.leaseMs),
      QUOTA_STORE_QUERY_TIMEOUT: `${options.queryTimeoutMs}ms`,
      FAIRNESS_FREE_LIMIT: String(slotLimit),
      ...clockEnv
    }
    members.push({ index, app, env, nats: natsProxy, postgres: postgresProxy, clockFile, incarnations: [] })
  }
  const started = await startCluster({}, database.pool, options.partitions, options.members, (index) => ({
    ...members[index]!.env
  }))
  started.forEach((member, index) => members[index]!.incarnations.push(member.serve))
  const tables = ["holds", "usage_ledger", "usage_totals", "slots", "user_limits"]
  await database.pool.query(doubtSql(tables))
  const world = {
    dir,
    nats,
    database,
    prefix,
    partitions: options.partitions,
    queryTimeoutMs: options.queryTimeoutMs,
    members,
    standby,
    closing: { value: false }
  }
  openWorlds.add(world)
  return world
}

/** The worlds opened and not yet closed, for endEverything. */
const openWorlds = new Set<NemesisWorld>()

/** How long endEverything waits for the worlds to close before it kills what is left. */
const endMsMax = 10_000

/** The ids of this process's children (serve, nats-server), read from /proc. */
const childPids = (): Array<number> =>
  readdirSync("/proc")
    .filter((entry) => /^\d+$/.test(entry))
    .flatMap((entry) => {
      try {
        // After the command's closing parenthesis: state, then the parent's id.
        const stat = readFileSync(`/proc/${entry}/stat`, "utf8")
        const parent = Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1])
        return parent === process.pid ? [Number(entry)] : []
      } catch {
        return []
      }
    })

/**
 * On SIGINT or SIGTERM: every open world closed (processes, proxies, database, nats-server), bounded;
 * then any child of this process still there (one started before its world was complete) killed.
 */
export const endEverything = async (): Promise<void> => {
  await Promise.race([
    Promise.allSettled([...openWorlds].map((world) => closeWorld(world))),
    new Promise((resolve) => setTimeout(resolve, endMsMax))
  ])
  // A pair started for a world that never opened (or did not close in time).
  await stopStandbyPairs()
  for (const pid of childPids()) {
    try {
      process.kill(pid, "SIGCONT")
      process.kill(pid, "SIGKILL")
    } catch {
      // ended meanwhile
    }
  }
}

/** Starts the member's process again (after a kill): the same settings, a new owner id. */
export const restartMember = (member: NemesisMember): ServeProcess => {
  const serve = startServe(member.env)
  member.incarnations.push(serve)
  return serve
}

export const closeWorld = async (world: NemesisWorld | undefined): Promise<void> => {
  if (world === undefined) return
  openWorlds.delete(world)
  world.closing.value = true
  for (const member of world.members) {
    for (const serve of member.incarnations) {
      if (isRunning(serve)) serve.child.kill("SIGCONT")
      await stopServe(serve, "SIGKILL")
    }
    await member.nats.close()
    await member.postgres.close()
  }
  await world.database.drop()
  await world.standby?.stop()
  await world.nats.stop()
  await rm(world.dir, { recursive: true, force: true })
}
