/**
 * A Postgres failover behind a stable address, as three `serve` processes under the flow load see it:
 * the address (a proxy, HAProxy) moves from a primary that is gone to a promoted standby, every
 * session through it ends, every process's member lock goes at once. Shared by the standby-pair test
 * (test/cluster/postgresFailover.test.ts) and the Patroni stack's (test/ha/).
 *
 * What a run measures, from the moment a writable primary answers at the address (the fault says when):
 * how long until every partition answered a probe about a fresh user again (only a process that can
 * load from Postgres answers `ok`), the longest any partition went unserved from the fault on, the
 * commands the processes answered `unavailable` (their /metrics), what /readyz said meanwhile, and
 * whether any process exited. And what was lost: the flow checks (flows.ts) on the new primary, then
 * every user's `used` as the live processes answer it and as a fresh process loads it, against what
 * the clients were charged.
 */
import type { NatsConnection } from "@nats-io/transport-node"
import pg from "pg"
import { QuotaClient } from "../../src/client/QuotaClient.js"
import { readyz, scrape } from "../support/operations.js"
import type { ServeProcess } from "../support/processes.js"
import { startServe, stopServe } from "../support/processes.js"
import type { Gap, Member } from "./cluster.js"
import {
  logEntries,
  longestGaps,
  meter,
  ownerOf,
  sleep,
  startCluster,
  waitForBalance,
  watchPartitions
} from "./cluster.js"
import type { FlowSafety } from "./flows.js"
import { FlowLoad, describeViolations, describeWrongCounts, flowSafety, slotLimit } from "./flows.js"

export const servers = "127.0.0.1:4222"
export const partitions = 16
export const leaseMs = 6_000

/** When the fault happened and when a writable primary answered at the stable address again. */
export interface FaultTimes {
  readonly faultAt: number
  readonly writableAt: number
  /** When the standby was seen promoted (Patroni named a new leader), where the fault knows it. */
  readonly promotedAt?: number
  /** Anything the fault wants in the report (e.g. which node leads). */
  readonly note?: string
}

export interface FailoverFigures {
  /** From writableAt until the last partition answered `ok` again (the probe's resolution: ~100 ms). */
  readonly servedAgainMs: number
  readonly servedAgainPerPartition: ReadonlyMap<number, number>
  /** From the promotion (FaultTimes.promotedAt) until the last partition answered `ok` again. */
  readonly servedAfterPromotionMs: number | undefined
  /** From the fault until every partition answered `ok` again (the client-side outage). */
  readonly servedAfterFaultMs: number
  /** The longest any partition went without an `ok`, from the fault on. */
  readonly longestUnserved: Gap
  /**
   * Partitions claimed from the fault on, summed over the processes' "claimed partitions" lines: the
   * partition count when each was claimed once after the failover, more when claims moved them between
   * processes (the first to return taking others' shares, then handing them off).
   */
  readonly claimedAfterFault: number
  /** Commands the processes answered `unavailable` during the run (their quota_commands_total). */
  readonly unavailable: number
  /** What the processes' /readyz said of Postgres while polled during the fault, with how often. */
  readonly readyzSaid: Readonly<Record<string, number>>
  /** Processes that exited during the run, or not with 0 when stopped (the failover is ridden out without a restart). */
  readonly exited: ReadonlyArray<string>
  readonly safety: FlowSafety
  /** Users whose `used` differs from what the clients were charged: as the live processes, then a fresh one, answer. */
  readonly usageLive: ReadonlyArray<string>
  readonly usageFresh: ReadonlyArray<string>
  readonly load: {
    readonly granted: number
    readonly refused: number
    readonly acquired: number
    readonly failures: number
    readonly retries: number
    readonly longestCallMs: number
  }
  readonly summary: string
}

export interface FailoverOptions {
  readonly nc: NatsConnection
  readonly prefix: string
  /** DATABASE_URL at the stable address. */
  readonly stableUrl: string
  readonly label: string
  readonly seed: number
  /** Runs the fault: returns when a writable primary answers at the stable address. */
  readonly fault: () => Promise<FaultTimes>
  /** How long the load runs before the fault and after the primary is back. */
  readonly beforeMs?: number
  readonly afterMs?: number
  /** Settings of the processes beyond the stable address, prefix, partitions and lease. */
  readonly env?: Record<string, string>
}

/** quota_commands_total{status="unavailable"} summed over ops, on one process. */
const unavailableOf = async (serve: ServeProcess): Promise<number> => {
  const port = serve.httpPort()
  if (port === undefined) return 0
  const samples = await scrape(port)
  let total = 0
  for (const [series, value] of samples)
    if (series.startsWith("quota_commands_total{") && series.includes('status="unavailable"')) total += value
  return total
}

/** Polls every member's /readyz until stopped: counts what each said of Postgres ("ready" when up). */
const pollReadyz = (members: ReadonlyArray<Member>) => {
  const said: Record<string, number> = {}
  let running = true
  const loop = (async () => {
    while (running) {
      await Promise.all(
        members.map(async (member) => {
          const port = member.serve.httpPort()
          if (port === undefined) return
          const answer = await readyz(port).catch(() => undefined)
          if (answer === undefined) return
          const reasons = answer.body["reasons"] as Record<string, string> | undefined
          const key = answer.status === 200 ? "ready" : (reasons?.["postgres"] ?? JSON.stringify(answer.body))
          said[key] = (said[key] ?? 0) + 1
        })
      )
      await sleep(200)
    }
  })()
  return {
    stop: async () => {
      running = false
      await loop
      return said
    }
  }
}

/**
 * Per user of the load whose calls all resolved, `used` of the load's meter as `client` answers it,
 * against the sum of the holds the clients were granted (every one committed in full).
 */
export const usageAgainstCharges = async (client: QuotaClient, load: FlowLoad): Promise<Array<string>> => {
  const charged = new Map<string, number>()
  for (const hold of load.acknowledged.holds.values())
    charged.set(hold.user, (charged.get(hold.user) ?? 0) + hold.amount)
  const wrong: Array<string> = []
  for (const [user, amount] of charged) {
    if (load.uncertain.has(user)) continue
    const usage = await client.getUsage({ user })
    if (usage.status !== "ok") {
      wrong.push(`${user}: get_usage answered ${usage.status}`)
      continue
    }
    const used = usage.meters.find((each) => each.meter === meter)?.used ?? 0
    if (used !== amount) wrong.push(`${user}: used ${used}, clients were charged ${amount}`)
  }
  return wrong
}

/** The members' env for a run: the stable address, this run's prefix, the test's partitions and lease. */
export const failoverEnv = (options: FailoverOptions): Record<string, string> => ({
  DATABASE_URL: options.stableUrl,
  QUOTA_PREFIX: options.prefix,
  QUOTA_PARTITIONS: String(partitions),
  QUOTA_LEASE_MS: String(leaseMs),
  FAIRNESS_FREE_LIMIT: String(slotLimit),
  ...options.env
})

/**
 * A pool at the stable address for the checks: its connections made after the failover reach the new
 * primary. Errors of idle connections (the failover ends them) are expected.
 */
export const stablePool = (url: string): pg.Pool => {
  const pool = new pg.Pool({ connectionString: url, max: 4 })
  pool.on("error", () => {})
  return pool
}

/**
 * Starts three members at the stable address (on a database of the run's own: a database serves one
 * prefix), runs the load on them, the fault, the load again, and measures (see the file's comment);
 * then stops them (SIGTERM: each must exit 0) and asks a fresh process alone. `members` is set as they
 * start, so that the caller can kill them if the run throws.
 */
export const runFailover = async (
  options: FailoverOptions,
  members: Array<Member>
): Promise<FailoverFigures> => {
  const { nc, prefix } = options
  const pool = stablePool(options.stableUrl)
  try {
    members.push(...(await startCluster(failoverEnv(options), pool, partitions, 3)))
    const load = await FlowLoad.start({
      servers,
      prefix,
      partitions,
      label: options.label,
      workers: 32,
      // Few hold users with a low limit: their limits are reached within a run even on a slow machine
      // (at 40, a run of 125 holds across 16 users reached none), so an over-grant would show.
      holdUsersPerPartition: 1,
      holdLimit: 20,
      slotUsersPerPartition: 2,
      seed: options.seed,
      // Rides out a failover of up to ~60 s (Patroni's promotion included): attempts 25-500 ms apart.
      retry: { attemptsMax: 120, delayMsMax: 500 }
    })
    const watch = watchPartitions(nc, prefix, partitions)
    await sleep(options.beforeMs ?? 3_000)
    const unavailableBefore = await Promise.all(members.map((member) => unavailableOf(member.serve)))
    const readyzPoll = pollReadyz(members)
    const times = await options.fault()
    await sleep(options.afterMs ?? 3_000)
    const readyzSaid = await readyzPoll.stop()
    const report = await load.stop()
    const stoppedAt = Date.now()
    const oks = await watch.stop()
    const unavailableAfter = await Promise.all(members.map((member) => unavailableOf(member.serve)))
    const unavailable = unavailableAfter.reduce(
      (sum, value, index) => sum + value - unavailableBefore[index]!,
      0
    )
    const exited = members
      .filter((member) => member.serve.child.exitCode !== null || member.serve.child.signalCode !== null)
      .map((member) => `${member.owner} exited during the run`)

    const servedAgainPerPartition = new Map<number, number>()
    for (const [partition, sent] of oks) {
      const first = sent.find((time) => time >= times.writableAt)
      servedAgainPerPartition.set(partition, first === undefined ? Infinity : first - times.writableAt)
    }
    const servedAgainMs = Math.max(...servedAgainPerPartition.values())
    const lastServedAt = times.writableAt + servedAgainMs
    const servedAfterPromotionMs =
      times.promotedAt === undefined ? undefined : lastServedAt - times.promotedAt
    const servedAfterFaultMs = lastServedAt - times.faultAt
    const longestUnserved = longestGaps(oks, times.faultAt, stoppedAt).reduce((left, right) =>
      right.ms > left.ms ? right : left
    )

    const claimedAfterFault = members
      .flatMap((member) => logEntries(member.serve))
      .filter((entry) => entry.msg === "claimed partitions" && entry.time >= times.faultAt)
      .reduce((sum, entry) => sum + (Array.isArray(entry["partitions"]) ? entry["partitions"].length : 0), 0)
    const safety = await flowSafety(pool, load, times.faultAt, partitions)
    const live = await QuotaClient.connect({ servers, prefix, partitions, timeoutMs: 2_000 })
    const usageLive = await usageAgainstCharges(live, load).finally(() => live.close())
    for (const member of members) {
      const code = await stopServe(member.serve)
      if (code !== 0) exited.push(`${member.owner} exited ${code} on SIGTERM`)
    }
    const usageFresh = await freshProcessUsage(options, load, pool)
    const figures = {
      servedAgainMs,
      servedAgainPerPartition,
      servedAfterPromotionMs,
      servedAfterFaultMs,
      longestUnserved,
      claimedAfterFault,
      unavailable,
      readyzSaid,
      exited,
      safety,
      usageLive,
      usageFresh,
      load: {
        granted: load.counts.granted,
        refused: load.counts.refused,
        acquired: load.counts.acquired,
        failures: load.failures.length,
        retries: report.retries,
        longestCallMs: report.longestCallMs
      }
    }
    return { ...figures, summary: describeFigures(figures, times) }
  } finally {
    await pool.end()
  }
}

/**
 * `used` per user as a process started after the run answers it, alone (the three have left): every
 * user it answers for is loaded from the new primary, none from a memory that lived through the fault.
 */
const freshProcessUsage = async (
  options: FailoverOptions,
  load: FlowLoad,
  pool: pg.Pool
): Promise<Array<string>> => {
  const fresh = startServe(failoverEnv(options))
  try {
    await Promise.race([
      fresh.ready,
      fresh.exited.then((code) => {
        throw new Error(`the fresh process exited with ${code}:\n${fresh.output()}`)
      })
    ])
    await waitForBalance(pool, partitions, [ownerOf(fresh)], 20_000, () => fresh.output())
    const client = await QuotaClient.connect({
      servers,
      prefix: options.prefix,
      partitions,
      timeoutMs: 2_000
    })
    try {
      return await usageAgainstCharges(client, load)
    } finally {
      await client.close()
    }
  } finally {
    await stopServe(fresh)
  }
}

const describeFigures = (figures: Omit<FailoverFigures, "summary">, times: FaultTimes): string =>
  (times.promotedAt === undefined
    ? ""
    : `promoted ${times.promotedAt - times.faultAt} ms after the fault, `) +
  `writable primary at the address ${times.writableAt - times.faultAt} ms after the fault` +
  (times.note === undefined ? "" : ` (${times.note})`) +
  `; every partition served again ${figures.servedAgainMs} ms after that (` +
  (figures.servedAfterPromotionMs === undefined
    ? ""
    : `${figures.servedAfterPromotionMs} ms after the promotion, `) +
  `${figures.servedAfterFaultMs} ms after the fault) ` +
  `(per partition: ${[...figures.servedAgainPerPartition].map(([p, ms]) => `${p}: ${ms}`).join(", ")}); ` +
  `longest unserved from the fault on ${figures.longestUnserved.ms} ms (partition ${figures.longestUnserved.partition}); ` +
  `${figures.claimedAfterFault} partitions claimed from the fault on (of ${partitions}); ` +
  `${figures.unavailable} commands answered unavailable; /readyz said ${JSON.stringify(figures.readyzSaid)}; ` +
  `processes exited: ${figures.exited.length}; load: ${figures.load.granted} holds granted, ${figures.load.refused} refused, ` +
  `${figures.load.acquired} slots acquired, ${figures.load.retries} retries, ${figures.load.failures} failed calls, ` +
  `longest call ${figures.load.longestCallMs} ms; ${figures.safety.database.checked} acknowledgements checked; ` +
  `wrong answers ${describeWrongCounts(figures.safety)}; ${describeViolations(figures.safety)}; ` +
  `usage differing from the charges: ${figures.usageLive.length} live, ${figures.usageFresh.length} from a fresh process`

/** Everything a failover run must hold: nothing lost or wrong, no exit, the figures' bound. */
export const failoverViolations = (figures: FailoverFigures): Array<string> => [
  ...figures.safety.wrongAnswers.map(
    (answer) => `wrong answer: ${answer.op} ${answer.user} ${answer.what}: ${answer.status}`
  ),
  ...figures.safety.overGrants,
  ...figures.safety.database.violations,
  ...figures.safety.mismatches,
  ...figures.safety.slots.violations,
  ...figures.usageLive.map((line) => `live: ${line}`),
  ...figures.usageFresh.map((line) => `fresh process: ${line}`),
  ...figures.exited
]
