/**
 * Where the CPU went during a measured window (Linux /proc): this bench process, the server process it
 * started for the run (the coordinator, or the NATS echo service), Postgres (the bench's databases'
 * backends and the server's own processes), Redis, nats-server, and everything else on the machine
 * (other people's jobs included). In percent of one core, so 2 cores at full use add up to 200. On a shared 2-core machine
 * this is what tells whether a number was bounded by the system under test or by its neighbours.
 */
import { readFileSync, readdirSync } from "node:fs"

/** Linux's USER_HZ; 100 on every mainstream kernel configuration. */
const clockTicksPerSecond = 100

/** The server processes the bench started for a run (the coordinators, an echo service), reported apart. */
export interface ServerProcesses {
  readonly pids: ReadonlyArray<number>
  readonly label: string
}

export interface CpuShares {
  readonly bench: number
  /** The server processes the bench started for this run (the coordinators or the echo service). */
  readonly server: number
  readonly serverLabel: string
  readonly postgres: number
  readonly redis: number
  readonly nats: number
  readonly other: number
  /** Whole machine busy, all cores. */
  readonly machine: number
}

type Group = "server" | "postgres" | "redis" | "nats" | "unattributed"

interface Snapshot {
  readonly atMs: number
  readonly machineBusyTicks: number
  readonly benchMicros: number
  /** pid -> its group and CPU ticks so far. */
  readonly processes: ReadonlyMap<string, { readonly group: Group; readonly ticks: number }>
}

const readMachineBusyTicks = (): number => {
  try {
    const fields = readFileSync("/proc/stat", "utf8").split("\n")[0]!.trim().split(/\s+/).slice(1).map(Number)
    const [user = 0, nice = 0, system = 0, , , irq = 0, softirq = 0, steal = 0] = fields
    return user + nice + system + irq + softirq + steal
  } catch {
    return 0
  }
}

/** utime + stime of one process, in ticks; undefined when it is gone or unreadable. */
const processTicks = (pid: string): { name: string; ticks: number } | undefined => {
  try {
    const text = readFileSync(`/proc/${pid}/stat`, "utf8")
    const close = text.lastIndexOf(")")
    const name = text.slice(text.indexOf("(") + 1, close)
    const rest = text.slice(close + 2).split(" ")
    // After "pid (comm) ": state is field 3, utime field 14, stime field 15.
    return { name, ticks: Number(rest[11]) + Number(rest[12]) }
  } catch {
    return undefined
  }
}

/** utime + stime of one process, in milliseconds; 0 when it is gone or unreadable. */
export const processCpuMs = (pid: number): number =>
  ((processTicks(String(pid))?.ticks ?? 0) * 1_000) / clockTicksPerSecond

/** `postgres: 15/main: <user> <database> <host>(<port>) <state>`: a client backend and its database. */
const backendPattern = /^postgres: [^:]+: \S+ (\S+) (?:\S*\(\d+\)|\[local\])/

/**
 * A Postgres process is the bench's when it serves one of the bench's databases (named `bench_...`)
 * or is one of the server's own processes (WAL writer, checkpointer...), which work for every client.
 * Backends of other databases belong to other people's jobs: they count as "other".
 */
const postgresGroup = (pid: string): Group => {
  try {
    const command = readFileSync(`/proc/${pid}/cmdline`, "utf8").replace(/\0/g, " ").trim()
    const backend = backendPattern.exec(command)
    if (backend === null) return "postgres"
    return backend[1]!.startsWith("bench_") ? "postgres" : "unattributed"
  } catch {
    return "unattributed"
  }
}

const snapshot = (serverPids: ReadonlyArray<number>): Snapshot => {
  const processes = new Map<string, { group: Group; ticks: number }>()
  let pids: Array<string> = []
  try {
    pids = readdirSync("/proc").filter((entry) => /^\d+$/.test(entry))
  } catch {
    // not Linux: every share reads 0
  }
  for (const pid of pids) {
    const read = processTicks(pid)
    if (read === undefined) continue
    let group: Group = "unattributed"
    if (serverPids.includes(Number(pid))) group = "server"
    else if (read.name === "postgres") group = postgresGroup(pid)
    else if (read.name === "redis-server") group = "redis"
    else if (read.name === "nats-server") group = "nats"
    processes.set(pid, { group, ticks: read.ticks })
  }
  const usage = process.cpuUsage()
  return {
    atMs: performance.now(),
    machineBusyTicks: readMachineBusyTicks(),
    benchMicros: usage.user + usage.system,
    processes
  }
}

export interface CpuMeter {
  readonly stop: () => CpuShares
}

/** Starts measuring now; `stop` returns the shares since. */
export const startCpuMeter = (server: ServerProcesses | undefined): CpuMeter => {
  const start = snapshot(server?.pids ?? [])
  return {
    stop: () => {
      const end = snapshot(server?.pids ?? [])
      const seconds = Math.max(1e-3, (end.atMs - start.atMs) / 1000)
      const percentOfTicks = (ticks: number) => (100 * ticks) / clockTicksPerSecond / seconds
      const bench = (100 * (end.benchMicros - start.benchMicros)) / 1e6 / seconds
      // Per process: what it used since the start (all of it when it started after). A process that
      // ended during the window is lost from both and its CPU shows as "other".
      const ticksOf = { server: 0, postgres: 0, redis: 0, nats: 0, unattributed: 0 }
      for (const [pid, now] of end.processes) {
        ticksOf[now.group] += now.ticks - (start.processes.get(pid)?.ticks ?? 0)
      }
      const group = (key: Group) => percentOfTicks(ticksOf[key])
      const machine = percentOfTicks(end.machineBusyTicks - start.machineBusyTicks)
      const shares = {
        bench,
        server: group("server"),
        serverLabel: server?.label ?? "server",
        postgres: group("postgres"),
        redis: group("redis"),
        nats: group("nats")
      }
      const known = shares.bench + shares.server + shares.postgres + shares.redis + shares.nats
      return { ...shares, other: Math.max(0, machine - known), machine }
    }
  }
}

/** e.g. "bench 95 · coord 60 · pg 30 · nats 5 · other 10 (of 200)". */
export const formatCpu = (shares: CpuShares, cores: number): string => {
  const parts: Array<string> = [`bench ${Math.round(shares.bench)}`]
  if (shares.server >= 0.5) parts.push(`${shares.serverLabel} ${Math.round(shares.server)}`)
  if (shares.postgres >= 0.5) parts.push(`pg ${Math.round(shares.postgres)}`)
  if (shares.redis >= 0.5) parts.push(`redis ${Math.round(shares.redis)}`)
  if (shares.nats >= 0.5) parts.push(`nats ${Math.round(shares.nats)}`)
  parts.push(`other ${Math.round(shares.other)}`)
  return `${parts.join(" · ")} (of ${cores * 100})`
}
