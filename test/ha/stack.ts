/**
 * The Patroni stack of scripts/ha-stack.sh (etcd, two Postgres 15 under Patroni, HAProxy routing to the
 * leader) for the HA test: started in a directory of the test's own on ports of its own, asked who
 * leads through Patroni's REST API, its leader's postmaster killed, switched over with patronictl.
 */
import { execFile } from "node:child_process"
import { existsSync } from "node:fs"
import { chmod, mkdtemp, readFile, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { promisify } from "node:util"
import pg from "pg"
import { repositoryRoot } from "../support/compiledServe.js"
import { sleep } from "../cluster/cluster.js"

const execFileAsync = promisify(execFile)
const script = join(repositoryRoot, "scripts/ha-stack.sh")

/** Whether this machine has what the stack runs (Debian: apt-get install -y patroni etcd-server haproxy). */
export const haStackAvailable = (): boolean =>
  ["/usr/bin/patroni", "/usr/bin/etcd", "/usr/sbin/haproxy", "/usr/lib/postgresql/15/bin/initdb"].every(
    (path) => existsSync(path)
  )

/** How long a leader change may take to show (Patroni's ttl is 10 s, its loop 1 s). */
const leaderChangeMsMax = 30_000

export interface Member {
  readonly name: string
  readonly role: string
  readonly state: string
  readonly port: number
  readonly timeline?: number
}

export interface HaStack {
  readonly dir: string
  /** DATABASE_URL of the `postgres` database through HAProxy: the stable address. */
  readonly url: string
  readonly urlOf: (database: string) => string
  readonly synchronous: boolean
  /** The members as Patroni sees them (GET /cluster). */
  readonly members: () => Promise<ReadonlyArray<Member>>
  /** The running leader's name, waiting (up to 30 s) until there is one other than `not`. */
  readonly leader: (not?: string) => Promise<Member>
  /** SIGKILL of the leader's postmaster (its Patroni lives on and fails it over). */
  readonly killPostmaster: (name: string) => Promise<void>
  /** `patronictl switchover --force` from the leader to `candidate`. */
  readonly switchover: (leader: string, candidate: string) => Promise<void>
  /** Until the leader has a streaming standby (synchronous, in synchronous mode) again. */
  readonly healthy: () => Promise<void>
  /** Until a writable primary on `port` answers at the stable address; returns when it did. */
  readonly writableAt: (port: number) => Promise<number>
  readonly logs: () => Promise<string>
  readonly stop: () => Promise<void>
}

export const startHaStack = async (options: {
  readonly synchronous: boolean
  readonly portBase: number
}): Promise<HaStack> => {
  const parent = await mkdtemp(join(tmpdir(), "quota-ha-test-"))
  // Patroni runs as `postgres` (when the test runs as root) and must reach its directory inside.
  await chmod(parent, 0o755)
  const dir = join(parent, "stack")
  const env = {
    ...process.env,
    HA_DIR: dir,
    HA_PORT_BASE: String(options.portBase),
    HA_SYNCHRONOUS: String(options.synchronous)
  }
  const run = (command: string) => execFileAsync("bash", [script, command], { env, timeout: 120_000 })
  const stop = async () => {
    await run("down").catch(() => undefined)
    await rm(parent, { recursive: true, force: true })
  }
  const started = await run("up").catch(async (error: unknown) => {
    await stop()
    throw error
  })
  const settings = new Map(
    started.stdout
      .split("\n")
      .filter((line) => line.includes("="))
      .map((line) => [line.slice(0, line.indexOf("=")), line.slice(line.indexOf("=") + 1)])
  )
  const url = settings.get("DATABASE_URL")!
  const restPorts = [Number(settings.get("HA_REST1_PORT")), Number(settings.get("HA_REST2_PORT"))]
  const patroniConfig = settings.get("HA_PATRONI_CONFIG")!
  const urlOf = (database: string) => {
    const next = new URL(url)
    next.pathname = `/${database}`
    return next.toString()
  }

  const members = async (): Promise<ReadonlyArray<Member>> => {
    // Either node's API answers for the cluster; one may be restarting.
    for (const port of restPorts) {
      try {
        const response = await fetch(`http://127.0.0.1:${port}/cluster`, {
          signal: AbortSignal.timeout(1_000)
        })
        const body = (await response.json()) as { members: Array<Member> }
        return body.members
      } catch {
        continue
      }
    }
    return []
  }

  const leader = async (not?: string): Promise<Member> => {
    const until = Date.now() + leaderChangeMsMax
    for (;;) {
      const found = (await members()).find(
        (member) => member.role === "leader" && member.state === "running" && member.name !== not
      )
      if (found !== undefined) return found
      if (Date.now() > until)
        throw new Error(`no leader other than ${not}: ${JSON.stringify(await members())}`)
      await sleep(50)
    }
  }

  const writableAt = async (port: number): Promise<number> => {
    const until = Date.now() + leaderChangeMsMax
    for (;;) {
      const client = new pg.Client({ connectionString: url, connectionTimeoutMillis: 1_000 })
      client.on("error", () => {})
      const answered = await client
        .connect()
        .then(() =>
          client.query<{ port: number; writable: boolean }>(
            "select inet_server_port() as port, not pg_is_in_recovery() as writable"
          )
        )
        .then((result) => result.rows[0])
        .catch(() => undefined)
        .finally(() => client.end().catch(() => undefined))
      if (answered?.writable === true && answered.port === port) return Date.now()
      if (Date.now() > until) throw new Error(`no writable primary on ${port} through HAProxy`)
      await sleep(25)
    }
  }

  const healthy = async (): Promise<void> => {
    const until = Date.now() + leaderChangeMsMax * 2
    const wanted = options.synchronous ? "sync_standby" : "replica"
    for (;;) {
      const found = await members()
      if (
        found.some((member) => member.role === "leader" && member.state === "running") &&
        found.some((member) => member.role === wanted && member.state === "running")
      )
        return
      if (Date.now() > until) throw new Error(`the stack did not heal: ${JSON.stringify(found)}`)
      await sleep(100)
    }
  }

  return {
    dir,
    url,
    urlOf,
    synchronous: options.synchronous,
    members,
    leader,
    killPostmaster: async (name) => {
      const pid = Number((await readFile(join(dir, name, "postmaster.pid"), "utf8")).split("\n")[0])
      process.kill(pid, "SIGKILL")
    },
    switchover: async (from, candidate) => {
      await execFileAsync(
        "patronictl",
        ["-c", patroniConfig, "switchover", "--leader", from, "--candidate", candidate, "--force"],
        { timeout: 60_000 }
      )
    },
    healthy,
    writableAt,
    logs: async () => {
      const parts = await Promise.all(
        ["pg1", "pg2", "haproxy"].map(async (name) => {
          const text = await readFile(join(dir, "log", `${name}.log`), "utf8").catch(() => "")
          return `--- ${name}\n${text
            .split("\n")
            .filter((line) => !line.includes("no action"))
            .slice(-60)
            .join("\n")}`
        })
      )
      return parts.join("\n")
    },
    stop
  }
}
