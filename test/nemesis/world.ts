/**
 * What the nemesis runs against: a nats-server of its own (JetStream, the deployed ping settings,
 * restartable), a fresh database, and three `serve` processes (the compiled build), each reaching NATS
 * and Postgres through TCP proxies of its own (so one process at a time can be cut off, and a failover
 * can move every process's database address at once), with its own application_name (so its sessions
 * can be found in pg_stat_activity) and, where libfaketime is installed, a wall clock the nemesis can
 * shift (performance.now is left alone).
 *
 * The database is the shared server's, or, for runs that fail Postgres over, restart it or cross a
 * month's end, a primary and synchronous standby of the nemesis's own (standby.ts). A world that
 * crosses a month's end sets every clock, Postgres's included, the same distance ahead with libfaketime
 * (`worldOffsetMs`), so that the month ends in the middle of the faults.
 *
 * A deferred trigger on every table a write touches sleeps in COMMIT when the switch table says so for
 * the writing process (as test/store/unknownOutcome.test.ts does for one hold): with the processes'
 * short store query timeout, those commits end with an outcome unknown to the process.
 */
import { existsSync, readdirSync, readFileSync } from "node:fs"
import { mkdtemp, rm, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import pg from "pg"
import type { ServeProcess, TestDatabase } from "../support/processes.js"
import { createTestDatabase, randomPrefix, startServe, stopServe } from "../support/processes.js"
import type { TcpProxy } from "../support/tcpProxy.js"
import { startTcpProxy } from "../support/tcpProxy.js"
import { logEntries, startCluster } from "../cluster/cluster.js"
import { slotLimit } from "../cluster/flows.js"
import type { NemesisNats } from "./natsServer.js"
import { startNemesisNats } from "./natsServer.js"
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
  readonly nats: NemesisNats
  /** The nemesis's own sessions (checks, fault switches); with a pair of its own, through `adminProxy`. */
  readonly database: TestDatabase
  readonly prefix: string
  readonly partitions: number
  readonly leaseMs: number
  readonly queryTimeoutMs: number
  /** The processes' QUOTA_CLOCK_OFFSET_MAX_MS: the most a serving process's clock may be off. */
  readonly clockOffsetMaxMs: number
  /** How far every clock of the world (processes and Postgres) is set ahead of this machine's. */
  readonly worldOffsetMs: number
  /** The month's end the world crosses (ms of world time), when it crosses one. */
  readonly monthEndAt: number | undefined
  readonly members: ReadonlyArray<NemesisMember>
  /** A primary and synchronous standby of the nemesis's own (else the shared server). */
  readonly standby: StandbyPair | undefined
  /** The nemesis's own route to the pair's primary, moved with the processes' on a failover. */
  readonly adminProxy: TcpProxy | undefined
  /** Set when closeWorld begins: the processes' ends from then on are the nemesis's own. */
  readonly closing: { value: boolean }
}

export interface WorldOptions {
  readonly members: number
  readonly partitions: number
  readonly leaseMs: number
  /** The processes' QUOTA_STORE_QUERY_TIMEOUT: a commit sleeping longer is of unknown outcome. */
  readonly queryTimeoutMs: number
  readonly clockOffsetMaxMs: number
  /** Each process's wall clock shiftable (libfaketime): the clock faults. */
  readonly clock: boolean
  /** A primary of its own with a synchronous standby (stalls, failovers, restarts, a month's end). */
  readonly standby: boolean
  /** Where the world's clocks are set: the month's end it crosses and when (undefined: the real time). */
  readonly monthEnd?: { readonly at: number; readonly afterMs: number }
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

/** libfaketime's relative form: seconds with a fraction ("+2592000.25", "-0.3"). */
const faketimeOffset = (offsetMs: number): string =>
  `${offsetMs < 0 ? "-" : "+"}${(Math.abs(offsetMs) / 1_000).toFixed(3)}`

/** libfaketime for a process whose wall clock is set by `FAKETIME` or read from a file. */
const faketimeEnv = (clock: { readonly file: string } | { readonly offsetMs: number }) => ({
  LD_PRELOAD: libfaketimePath,
  ...("file" in clock
    ? { FAKETIME_TIMESTAMP_FILE: clock.file }
    : { FAKETIME: faketimeOffset(clock.offsetMs) }),
  // Read again at most every second; the monotonic clock (performance.now) is left true.
  FAKETIME_CACHE_DURATION: "1",
  FAKETIME_DONT_FAKE_MONOTONIC: "1"
})

/** Sets a process's wall clock `offsetMs` away from the world's (0: the world's time). */
export const setClockOffset = async (world: NemesisWorld, member: NemesisMember, offsetMs: number) => {
  if (member.clockFile === undefined) return
  await writeFile(member.clockFile, `${faketimeOffset(world.worldOffsetMs + offsetMs)}\n`)
}

/** The world's time now (this machine's clock plus the world's offset): what Postgres reads. */
export const worldNow = (world: Pick<NemesisWorld, "worldOffsetMs">): number =>
  Date.now() + world.worldOffsetMs

/** How long the nemesis's own queries retry a lost connection (a failover or a restart of the pair). */
const adminRetryMsMax = 30_000

/** A connection-level failure (no SQLSTATE, or a connection or shutdown class): worth another try. */
const transient = (error: unknown): boolean => {
  const code = (error as { code?: unknown }).code
  return typeof code !== "string" || code.startsWith("08") || code.startsWith("57P")
}

/**
 * The nemesis's pool, whose queries try again on a lost connection: a failover drops every connection
 * of the pool at once, and a check or a fault switch must not fail for it.
 */
const retryingPool = (pool: pg.Pool): pg.Pool => {
  const query = async (...args: Array<unknown>): Promise<unknown> => {
    const until = Date.now() + adminRetryMsMax
    for (;;) {
      try {
        return await (pool.query as (...all: Array<unknown>) => Promise<unknown>)(...args)
      } catch (error) {
        if (!transient(error) || Date.now() > until) throw error
        await new Promise((resolve) => setTimeout(resolve, 250))
      }
    }
  }
  return new Proxy(pool, { get: (target, name) => (name === "query" ? query : Reflect.get(target, name)) })
}

/** A pool on the pair's database through a proxy of its own (it follows the primary on a failover). */
const adminOnPair = async (
  pair: StandbyPair
): Promise<{ readonly database: TestDatabase; readonly proxy: TcpProxy }> => {
  const proxy = await startTcpProxy("127.0.0.1", pair.primaryPort())
  const url = new URL(pair.database.url)
  url.port = String(proxy.port)
  const pool = new pg.Pool({
    connectionString: url.toString(),
    max: 4,
    options: "-c synchronous_commit=local"
  })
  pool.on("error", () => {})
  return {
    database: {
      name: pair.database.name,
      url: url.toString(),
      pool: retryingPool(pool),
      drop: () => pool.end()
    },
    proxy
  }
}

export const openWorld = async (options: WorldOptions): Promise<NemesisWorld> => {
  const dir = await mkdtemp(join(tmpdir(), "quota-nemesis-"))
  // The month's end `afterMs` from now on the world's clocks: every clock that far ahead.
  const worldOffsetMs =
    options.monthEnd === undefined ? 0 : options.monthEnd.at - options.monthEnd.afterMs - Date.now()
  const nats = await startNemesisNats(dir)
  const standby = options.standby
    ? await startStandbyPair(worldOffsetMs === 0 ? {} : { env: faketimeEnv({ offsetMs: worldOffsetMs }) })
    : undefined
  const admin = standby === undefined ? undefined : await adminOnPair(standby)
  const shared = admin === undefined ? await createTestDatabase("nemesis") : undefined
  const database = admin?.database ?? { ...shared!, pool: retryingPool(shared!.pool) }
  const prefix = randomPrefix("nem")
  const members: Array<NemesisMember> = []
  for (let index = 0; index < options.members; index += 1) {
    const natsProxy = await startTcpProxy("127.0.0.1", nats.port)
    const postgresPort = standby?.primaryPort() ?? Number(new URL(database.url).port || 5432)
    const postgresProxy = await startTcpProxy("127.0.0.1", postgresPort)
    const app = `nemesis-m${index}`
    const url = new URL(database.url)
    url.port = String(postgresProxy.port)
    url.searchParams.set("application_name", app)
    let clockFile: string | undefined
    if (options.clock || worldOffsetMs !== 0) {
      clockFile = join(dir, `clock-${index}`)
      await writeFile(clockFile, `${faketimeOffset(worldOffsetMs)}\n`)
    }
    const env = {
      // Every decision logged (debug): the stale-answer check reads them (staleAnswers.ts).
      LOG_LEVEL: "debug",
      DATABASE_URL: url.toString(),
      NATS_URL: `nats://127.0.0.1:${natsProxy.port}`,
      QUOTA_PREFIX: prefix,
      QUOTA_PARTITIONS: String(options.partitions),
      QUOTA_LEASE_MS: String(options.leaseMs),
      QUOTA_STORE_QUERY_TIMEOUT: `${options.queryTimeoutMs}ms`,
      QUOTA_CLOCK_OFFSET_MAX_MS: String(options.clockOffsetMaxMs),
      FAIRNESS_FREE_LIMIT: String(slotLimit),
      ...(clockFile === undefined ? {} : faketimeEnv({ file: clockFile }))
    }
    members.push({ index, app, env, nats: natsProxy, postgres: postgresProxy, clockFile, incarnations: [] })
  }
  const started = await startCluster({}, database.pool, options.partitions, options.members, (index) => ({
    ...members[index]!.env
  }))
  started.forEach((member, index) => members[index]!.incarnations.push(member.serve))
  const tables = [
    "partition_log",
    "partition_progress",
    "holds",
    "usage_ledger",
    "usage_totals",
    "slots",
    "user_limits"
  ]
  await database.pool.query(doubtSql(tables))
  const world: NemesisWorld = {
    dir,
    nats,
    database,
    prefix,
    partitions: options.partitions,
    leaseMs: options.leaseMs,
    queryTimeoutMs: options.queryTimeoutMs,
    clockOffsetMaxMs: options.clockOffsetMaxMs,
    worldOffsetMs,
    monthEndAt: options.monthEnd?.at,
    members,
    standby,
    adminProxy: admin?.proxy,
    closing: { value: false }
  }
  openWorlds.add(world)
  return world
}

/**
 * Every process's database address (and the nemesis's own) moved to the pair's primary now: what a
 * failover endpoint, a DNS name or HAProxy on Patroni's `/primary` does. Every connection is dropped.
 */
export const followPrimary = (world: NemesisWorld): void => {
  if (world.standby === undefined) return
  const port = world.standby.primaryPort()
  for (const member of world.members) member.postgres.retarget(port)
  world.adminProxy?.retarget(port)
}

/** The month starts a run's world may cross into (UTC): a year's end, a short February, a leap one. */
const monthStarts = [
  Date.UTC(2026, 11, 1),
  Date.UTC(2027, 0, 1),
  Date.UTC(2027, 2, 1),
  Date.UTC(2027, 4, 1),
  Date.UTC(2028, 2, 1),
  Date.UTC(2028, 0, 1)
]

/** The month's end a seed's world crosses, and the period before it. */
export const monthEndOf = (seed: number): { at: number; before: number } => {
  const at = monthStarts[seed % monthStarts.length]!
  const date = new Date(at)
  return { at, before: Date.UTC(date.getUTCFullYear(), date.getUTCMonth() - 1, 1) }
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
  await world.adminProxy?.close()
  await world.standby?.stop()
  await world.nats.stop()
  await rm(world.dir, { recursive: true, force: true })
}
