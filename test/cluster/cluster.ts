/**
 * Helpers of the scale-out tests: several `serve` processes on one database and one subject prefix,
 * a load of reserve-then-commit cycles through the SDK over users spread on every partition, a probe
 * that asks every partition directly, and the checks that run on the database afterwards.
 *
 * The load never releases a hold and always commits the full amount: a user's capacity is only ever
 * consumed, so the sum of the amounts of all holds acknowledged to the client must stay within the
 * user's limit whatever the order of events. Any two grants made from the same capacity (a fenced
 * process that granted from stale memory) show up as a sum over the limit, even if they never reached
 * Postgres side by side.
 */
import type { NatsConnection } from "@nats-io/transport-node"
import type pg from "pg"
import { QuotaClient } from "../../src/client/QuotaClient.js"
import type { QuotaClientOptions } from "../../src/client/options.js"
import { partitionOf } from "../../src/domain/partition.js"
import type { AcknowledgedWrites } from "../support/databaseChecks.js"
import { tablesUpToDate } from "../support/databaseChecks.js"
import type { ServeProcess } from "../support/processes.js"
import { startServe, stopServe } from "../support/processes.js"
import { makeRng } from "../../bench/lib/rng.js"

export const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms))

/** The meter the load uses; its per-user limit is set with `set_limit` before a user's first reserve. */
export const meter = "analysis"

/** A user name that hashes to `partition`: `${label}-${partition}-${index}-${k}` for the first k that does. */
export const userOnPartition = (
  label: string,
  partition: number,
  index: number,
  partitions: number
): string => {
  for (let k = 0; ; k += 1) {
    const user = `${label}-${partition}-${index}-${k}`
    if (partitionOf(user, partitions) === partition) return user
  }
}

// ---------------------------------------------------------------------------------------------
// Processes
// ---------------------------------------------------------------------------------------------

export interface LogEntry {
  readonly msg: string
  readonly time: number
  readonly [field: string]: unknown
}

/** The JSON log lines a process wrote, from character `from` of its output on. */
export const logEntries = (serve: ServeProcess, from = 0): Array<LogEntry> =>
  serve
    .output()
    .slice(from)
    .split("\n")
    .flatMap((line) => {
      if (!line.startsWith("{")) return []
      try {
        const entry = JSON.parse(line) as LogEntry
        return typeof entry.msg === "string" ? [entry] : []
      } catch {
        return []
      }
    })

/** The owner id a process logged when it started serving (its rows in partition_owners carry it). */
export const ownerOf = (serve: ServeProcess): string => {
  const entry = logEntries(serve).find((line) => line.msg === "serving")
  if (entry === undefined || typeof entry["owner"] !== "string")
    throw new Error(`no "serving" log line with an owner:\n${serve.output()}`)
  return entry["owner"]
}

export interface OwnerRow {
  readonly partition: number
  readonly owner: string
  readonly epoch: number
  /** Whether the lease is still running, by the database's clock. */
  readonly live: boolean
}

export const ownerRows = async (pool: pg.Pool): Promise<Array<OwnerRow>> => {
  const result = await pool.query<{ partition: number; owner: string; epoch: string; live: boolean }>(`
    select partition, owner, epoch::text as epoch,
           lease_expires_at > (extract(epoch from clock_timestamp()) * 1000)::bigint as live
    from quota.partition_owners order by partition`)
  return result.rows.map((row) => ({ ...row, epoch: Number(row.epoch) }))
}

/**
 * Waits until every partition has a live lease and the owners are exactly `owners`, each with its fair
 * share (P/n rounded down or up). Returns the rows; throws with the processes' output past the deadline.
 */
export const waitForBalance = async (
  pool: pg.Pool,
  partitions: number,
  owners: ReadonlyArray<string>,
  deadlineMs: number,
  describe: () => string = () => ""
): Promise<Array<OwnerRow>> => {
  const until = Date.now() + deadlineMs
  let rows: Array<OwnerRow> = []
  for (;;) {
    rows = await ownerRows(pool)
    const counts = new Map<string, number>()
    for (const row of rows) if (row.live) counts.set(row.owner, (counts.get(row.owner) ?? 0) + 1)
    const fair = [Math.floor(partitions / owners.length), Math.ceil(partitions / owners.length)]
    const balanced =
      rows.length === partitions &&
      rows.every((row) => row.live) &&
      counts.size === owners.length &&
      owners.every((owner) => fair.includes(counts.get(owner) ?? 0))
    if (balanced) return rows
    if (Date.now() > until) {
      throw new Error(
        `partitions not balanced over ${owners.join(", ")} after ${deadlineMs} ms: ` +
          `${JSON.stringify(rows)}\n${describe()}`
      )
    }
    await sleep(100)
  }
}

export interface Member {
  readonly serve: ServeProcess
  readonly owner: string
}

/** Starts `count` processes one after the other and waits until they share the partitions evenly. */
export const startCluster = async (
  env: Record<string, string>,
  pool: pg.Pool,
  partitions: number,
  count: number,
  /** Settings of one member on top of `env` (e.g. its own route to the database). */
  envOf: (index: number) => Record<string, string> = () => ({})
): Promise<Array<Member>> => {
  const members: Array<Member> = []
  const started: Array<ServeProcess> = []
  try {
    for (let index = 0; index < count; index += 1) {
      const serve = startServe({ ...env, ...envOf(index) })
      started.push(serve)
      await Promise.race([
        serve.ready,
        serve.exited.then((code) => {
          throw new Error(`serve exited with ${code} before serving:\n${serve.output()}`)
        })
      ])
      members.push({ serve, owner: ownerOf(serve) })
    }
    await waitForBalance(
      pool,
      partitions,
      members.map((member) => member.owner),
      20_000,
      () => outputs(members)
    )
    return members
  } catch (error) {
    // The caller never sees these: left running, they served (and claimed in) whatever database
    // answered at their address next, a later run's included.
    await Promise.all(started.map((serve) => stopServe(serve, "SIGKILL")))
    throw error
  }
}

/** Every member's output, labelled, for a failure message. */
export const outputs = (members: ReadonlyArray<Member>): string =>
  members.map((member) => `--- ${member.owner}\n${withoutDecisions(member.serve.output())}`).join("\n")

/** A process's output without the info line it logs per decision (`"op":...`): what is left is its life. */
export const withoutDecisions = (output: string): string =>
  output
    .split("\n")
    .filter((line) => !line.includes('"op":"'))
    .join("\n")

// ---------------------------------------------------------------------------------------------
// Probe
// ---------------------------------------------------------------------------------------------

/**
 * One `get_usage` about a user of `partition`, straight over NATS (no SDK retries): whether it answered
 * `ok`. `index` picks the probe user (a fresh index asks about a user no process has in memory, so only
 * a process that can load it from Postgres answers `ok`).
 */
export const probePartition = async (
  nc: NatsConnection,
  prefix: string,
  partition: number,
  partitions: number,
  timeoutMs: number,
  index = 0
): Promise<boolean> => {
  const user = userOnPartition("probe", partition, index, partitions)
  try {
    const reply = await nc.request(
      `${prefix}.v1.${partition}.ops`,
      JSON.stringify({ op: "get_usage", user }),
      {
        timeout: timeoutMs
      }
    )
    return reply.json<{ status?: string }>().status === "ok"
  } catch {
    // no responders or a timeout: not served right now
    return false
  }
}

/** `probePartition` on every partition at once: which answered `ok`. */
export const probePartitions = async (
  nc: NatsConnection,
  prefix: string,
  partitions: number,
  timeoutMs: number,
  index = 0
): Promise<Set<number>> => {
  const answered = new Set<number>()
  await Promise.all(
    Array.from({ length: partitions }, async (_, partition) => {
      if (await probePartition(nc, prefix, partition, partitions, timeoutMs, index)) answered.add(partition)
    })
  )
  return answered
}

/**
 * Probes every partition every `intervalMs` from `since` until each has answered `ok` at least once.
 * Returns, per partition, how long after `since` its first `ok` arrived. Throws past `deadlineMs`.
 */
export const timeUntilEveryPartitionAnswers = async (
  nc: NatsConnection,
  prefix: string,
  partitions: number,
  since: number,
  deadlineMs: number
): Promise<Map<number, number>> => {
  const firstOk = new Map<number, number>()
  for (;;) {
    const roundStarted = Date.now()
    const answered = await probePartitions(nc, prefix, partitions, 300)
    for (const partition of answered)
      if (!firstOk.has(partition)) firstOk.set(partition, roundStarted - since)
    if (firstOk.size === partitions) return firstOk
    if (Date.now() - since > deadlineMs) {
      const missing = Array.from({ length: partitions }, (_, p) => p).filter((p) => !firstOk.has(p))
      throw new Error(`partitions ${missing.join(", ")} did not answer within ${deadlineMs} ms`)
    }
    await sleep(Math.max(0, 50 - (Date.now() - roundStarted)))
  }
}

/**
 * Probes each partition every `intervalMs` until stopped, each time about a user no process has seen
 * (so an `ok` comes only from a process that can load it, not from one answering from memory). Each
 * partition has its own loop: a probe that waits out its timeout on one partition delays no other's.
 * `stop` returns, per partition, the send times of the probes it answered `ok`.
 */
export const watchPartitions = (
  nc: NatsConnection,
  prefix: string,
  partitions: number,
  intervalMs = 100
): { readonly stop: () => Promise<Map<number, Array<number>>> } => {
  const oks = new Map<number, Array<number>>(Array.from({ length: partitions }, (_, p) => [p, []]))
  let running = true
  const loops = Promise.all(
    Array.from({ length: partitions }, async (_, partition) => {
      for (let round = 1; running; round += 1) {
        const sentAt = Date.now()
        if (await probePartition(nc, prefix, partition, partitions, 500, round))
          oks.get(partition)!.push(sentAt)
        await sleep(Math.max(0, intervalMs - (Date.now() - sentAt)))
      }
    })
  )
  return {
    stop: async () => {
      running = false
      await loops
      return oks
    }
  }
}

export interface Gap {
  readonly partition: number
  /** The last `ok` before the gap (or `from`), and the first after it (or `to`, if none came). */
  readonly from: number
  readonly to: number
  readonly ms: number
}

/** Per partition, the longest stretch without an `ok` that overlaps [from, to]. */
export const longestGaps = (
  oks: ReadonlyMap<number, ReadonlyArray<number>>,
  from: number,
  to: number
): Array<Gap> =>
  [...oks].map(([partition, times]) => {
    let longest: Gap = { partition, from, to: from, ms: 0 }
    let previous = times.filter((time) => time <= from).at(-1) ?? from
    for (const time of [...times.filter((time) => time > from && time <= to), to]) {
      if (time - previous > longest.ms) longest = { partition, from: previous, to: time, ms: time - previous }
      previous = time
    }
    return longest
  })

// ---------------------------------------------------------------------------------------------
// Load
// ---------------------------------------------------------------------------------------------

export interface LoadOptions {
  readonly servers: string
  readonly prefix: string
  readonly partitions: number
  /** Label of the user names. */
  readonly label: string
  /** Concurrent callers, each doing reserve-then-commit cycles. */
  readonly workers: number
  /** Users in play at once per partition; an exhausted one is replaced by a fresh one of the same partition. */
  readonly usersPerPartition: number
  /** Per-user limit of `meter`, set before the user's first reserve. */
  readonly limit: number
  /** Reserve amounts are 1..amountMax. */
  readonly amountMax: number
  readonly client: QuotaClientOptions
  readonly seed: number
}

export interface LoadFailure {
  readonly at: number
  /** When the call was sent, where the load knows it. */
  readonly sentAt?: number
  readonly op: string
  readonly user: string
  readonly what: string
}

interface Slot {
  user: string
  /** Resolves when the user's limit is set. */
  ready: Promise<void>
  generation: number
  /** Refusals seen for this user; past a few it is retired. */
  refusals: number
}

export interface LoadReport {
  readonly cycles: number
  readonly granted: number
  readonly refused: number
  readonly users: number
  readonly failures: ReadonlyArray<LoadFailure>
  /** The longest single SDK call (retries included), in ms. */
  readonly longestCallMs: number
  readonly retries: number
  readonly messages: number
}

/**
 * Reserve-then-commit cycles through one `QuotaClient` (coalescing on), on users of every partition,
 * against a tight per-user limit. Every call must resolve with a decided status; anything else (a
 * rejection such as `QuotaRetriesExhausted`, an unexpected status) is recorded as a failure.
 */
export class Load {
  readonly acknowledged = {
    holds: new Map<string, { user: string; id: string; amount: number }>(),
    commits: new Map<string, { user: string; id: string; amount: number }>(),
    releases: new Map<string, { user: string; id: string }>(),
    adjustments: new Map<string, { user: string; id: string }>()
  }
  readonly failures: Array<LoadFailure> = []
  /** user -> limit it was given. */
  readonly limits = new Map<string, number>()
  private readonly slots: Array<Slot> = []
  private running = false
  private workers: Promise<void> = Promise.resolve()
  private cycles = 0
  private granted = 0
  private refused = 0
  private longestCallMs = 0
  private generations = 0

  private constructor(
    private readonly options: LoadOptions,
    readonly client: QuotaClient
  ) {}

  static async start(options: LoadOptions): Promise<Load> {
    const client = await QuotaClient.connect({
      servers: options.servers,
      prefix: options.prefix,
      partitions: options.partitions,
      ...options.client
    })
    const load = new Load(options, client)
    for (let partition = 0; partition < options.partitions; partition += 1) {
      for (let index = 0; index < options.usersPerPartition; index += 1) {
        const slot: Slot = { user: "", ready: Promise.resolve(), generation: 0, refusals: 0 }
        load.activate(slot, partition)
        load.slots.push(slot)
      }
    }
    await Promise.all(load.slots.map((slot) => slot.ready))
    load.running = true
    load.workers = Promise.all(
      Array.from({ length: options.workers }, (_, index) => load.worker(index))
    ).then(() => undefined)
    return load
  }

  /** Gives the slot a fresh user of `partition` and sets its limit. */
  private activate(slot: Slot, partition: number): void {
    const generation = (this.generations += 1)
    const user = userOnPartition(this.options.label, partition, generation, this.options.partitions)
    slot.user = user
    slot.generation = generation
    slot.refusals = 0
    slot.ready = this.call("set_limit", user, () =>
      this.client.setLimit({ user, meter, limit: this.options.limit })
    ).then((result) => {
      if (result?.status === "ok") this.limits.set(user, this.options.limit)
      else if (result !== undefined) this.fail("set_limit", user, `answered ${result.status}`)
    })
  }

  private fail(op: string, user: string, what: string): void {
    this.failures.push({ at: Date.now(), op, user, what })
  }

  /** Runs one SDK call; a rejection is a failure (undefined), a result is returned whatever its status. */
  private async call<R extends { status: string }>(
    op: string,
    user: string,
    run: () => Promise<R>
  ): Promise<R | undefined> {
    const started = Date.now()
    try {
      return await run()
    } catch (error) {
      this.fail(op, user, error instanceof Error ? `${error.name}: ${error.message}` : String(error))
      return undefined
    } finally {
      this.longestCallMs = Math.max(this.longestCallMs, Date.now() - started)
    }
  }

  private async worker(index: number): Promise<void> {
    const random = makeRng(this.options.seed * 1_000 + index).next
    for (let sequence = 0; this.running; sequence += 1) {
      const slot = this.slots[Math.floor(random() * this.slots.length)]!
      await slot.ready
      const { user, generation } = slot
      if (!this.limits.has(user)) {
        // Its set_limit failed (recorded): do not reserve against the plan's default limit.
        await sleep(10)
        continue
      }
      const id = `w${index}-${sequence}`
      const amount = 1 + Math.floor(random() * this.options.amountMax)
      const reserved = await this.call("reserve", user, () =>
        this.client.reserve({ user, meter, amount, id })
      )
      if (reserved === undefined) continue
      this.cycles += 1
      if (reserved.status === "reserved" || reserved.status === "exists") {
        this.acknowledged.holds.set(`${user}/${id}`, { user, id, amount })
        this.granted += 1
        const committed = await this.call("commit", user, () => this.client.commit({ user, id, amount }))
        if (committed === undefined) continue
        if (committed.status === "committed" || committed.status === "exists")
          this.acknowledged.commits.set(`${user}/${id}`, { user, id, amount })
        else this.fail("commit", user, `answered ${committed.status}`)
      } else if (reserved.status === "insufficient_quota") {
        this.refused += 1
        // The limit was hit: after a few refusals (or none left at all) the user makes way for a new one.
        slot.refusals += 1
        const available = "available" in reserved ? reserved.available : 0
        if ((available === 0 || slot.refusals >= 3) && slot.generation === generation) {
          this.activate(slot, Math.floor(this.slots.indexOf(slot) / this.options.usersPerPartition))
        }
      } else {
        this.fail("reserve", user, `answered ${reserved.status}`)
      }
    }
  }

  /** Stops the workers after their current cycle and closes the client. */
  async stop(): Promise<LoadReport> {
    this.running = false
    await this.workers
    await Promise.all(this.slots.map((slot) => slot.ready))
    const counters = this.client.counters()
    await this.client.close()
    return {
      cycles: this.cycles,
      granted: this.granted,
      refused: this.refused,
      users: this.limits.size,
      failures: this.failures,
      longestCallMs: this.longestCallMs,
      retries: counters.retries,
      messages: counters.messagesSent
    }
  }

  /** A copy of the acknowledged writes, in the shape `checkDatabase` takes. */
  snapshot(): AcknowledgedWrites {
    return {
      holds: new Map(this.acknowledged.holds),
      commits: new Map(this.acknowledged.commits),
      releases: new Map(this.acknowledged.releases),
      adjustments: new Map(this.acknowledged.adjustments)
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Checks beyond checkDatabase
// ---------------------------------------------------------------------------------------------

/** What the checks below read of a load: the holds and commits acknowledged, and each user's limit. */
export interface GrantRecord {
  readonly acknowledged: Pick<AcknowledgedWrites, "holds" | "commits">
  readonly limits: ReadonlyMap<string, number>
}

/**
 * Over-grants as the clients saw them: per user, the amounts of every hold acknowledged (`reserved` or
 * `exists`) must fit the limit, since the load never returns capacity (no release, full commits).
 */
export const clientOverGrants = (load: GrantRecord): Array<string> => {
  const granted = new Map<string, number>()
  for (const hold of load.acknowledged.holds.values())
    granted.set(hold.user, (granted.get(hold.user) ?? 0) + hold.amount)
  const violations: Array<string> = []
  for (const [user, total] of granted) {
    const limit = load.limits.get(user)
    if (limit === undefined) violations.push(`${user}: granted ${total} with no limit set`)
    else if (total > limit) violations.push(`${user}: clients were granted ${total} > limit ${limit}`)
  }
  return violations
}

/**
 * What Postgres holds against what clients were told, once every call resolved: each hold row is an
 * acknowledged hold (no grant nobody was told of), and each is committed with its full amount (every
 * commit resolved). Also the DB-side form of "no over-grant": per user, the amounts of pending and
 * committed holds fit the limit.
 */
export const databaseAgainstClients = async (pool: pg.Pool, load: GrantRecord): Promise<Array<string>> => {
  await tablesUpToDate(pool)
  const violations: Array<string> = []
  const rows = await pool.query<{
    user_id: string
    id: string
    amount: string
    consumed: string
    state: string
  }>("select user_id, id, amount::text, consumed::text, state from quota.holds")
  const perUser = new Map<string, number>()
  for (const row of rows.rows) {
    const key = `${row.user_id}/${row.id}`
    if (!load.acknowledged.holds.has(key))
      violations.push(`hold ${key} (${row.state}) was never acknowledged`)
    if (!load.acknowledged.commits.has(key))
      violations.push(`hold ${key} is ${row.state}, commit not acknowledged`)
    else if (row.state !== "committed" || row.consumed !== row.amount)
      violations.push(`hold ${key}: ${row.state}, consumed ${row.consumed} of ${row.amount}`)
    if (row.state === "pending" || row.state === "committed")
      perUser.set(row.user_id, (perUser.get(row.user_id) ?? 0) + Number(row.amount))
  }
  for (const [user, total] of perUser) {
    const limit = load.limits.get(user)
    if (limit !== undefined && total > limit)
      violations.push(`${user}: holds in Postgres add up to ${total} > limit ${limit}`)
  }
  return violations
}

export const describeFailures = (failures: ReadonlyArray<LoadFailure>, since: number): string =>
  failures
    .slice(0, 20)
    .map((failure) => `+${failure.at - since} ms ${failure.op} ${failure.user}: ${failure.what}`)
    .join("\n")
