/**
 * The load of hold flows and slot flows that the fault tests run (postgresReset, natsReset, natsSilent,
 * natsCluster), and the checks that judge each answer against its flow's history (see
 * postgresReset.test.ts for what each check catches).
 */
import type pg from "pg"
import { makeRng } from "../../bench/lib/rng.js"
import { QuotaClient } from "../../src/client/QuotaClient.js"
import { partitionOf } from "../../src/domain/partition.js"
import { expect } from "vitest"
import type { AcknowledgedWrites } from "../support/databaseChecks.js"
import { checkDatabase, tablesUpToDate } from "../support/databaseChecks.js"
import type { LoadFailure, Member } from "./cluster.js"
import {
  clientOverGrants,
  databaseAgainstClients,
  logEntries,
  meter,
  sleep,
  userOnPartition
} from "./cluster.js"

/** Slots per user (the free plan's, set with FAIRNESS_FREE_LIMIT): several workers share a user, so `busy` happens. */
export const slotLimit = 2
export const holdLimit = 40
/** Long enough never to run out during a test: a slot or hold gone means someone answered wrongly. */
const slotLeaseMs = 120_000
const holdTtlMs = 600_000

export interface FlowLoadOptions {
  readonly servers: string
  readonly prefix: string
  readonly partitions: number
  readonly label: string
  readonly workers: number
  readonly holdUsersPerPartition: number
  /** Each hold user's limit (default holdLimit): lower where a short or slow run must still reach it. */
  readonly holdLimit?: number
  readonly slotUsersPerPartition: number
  readonly seed: number
  /** The SDK's retries (default: 60 attempts 25-250 ms apart, ~15 s when every attempt fails fast). */
  readonly retry?: { readonly attemptsMax: number; readonly delayMsMax: number }
}

export interface WrongAnswer {
  readonly at: number
  readonly op: string
  readonly user: string
  readonly what: string
  readonly status: string
}

export interface SlotSpan {
  readonly user: string
  readonly job: string
  /** When `acquired`/`exists` arrived: the slot was held from before then. */
  readonly grantedAt: number
  /** When release_slot was first sent (undefined: not sent); the slot is held until after then. */
  releaseSentAt?: number
  releaseStatus?: string
}

interface UserSlot {
  user: string
  ready: Promise<void>
  generation: number
  refusals: number
}

/**
 * Workers running hold flows and slot flows through one QuotaClient, each flow on one user and one
 * hold id or job, its steps in order, so each answer can be judged against the flow's own history.
 * Hold users have a tight limit and make way for fresh ones once refused; slot users stay for the run.
 */
export class FlowLoad {
  readonly acknowledged = {
    holds: new Map<string, { user: string; id: string; amount: number }>(),
    commits: new Map<string, { user: string; id: string; amount: number }>(),
    releases: new Map<string, { user: string; id: string }>(),
    adjustments: new Map<string, { user: string; id: string }>()
  }
  /** user/id/key -> amount of each consume answered `consumed` or `exists`. */
  readonly consumes = new Map<string, { user: string; id: string; key: string; amount: number }>()
  readonly limits = new Map<string, number>()
  readonly failures: Array<LoadFailure> = []
  readonly wrongAnswers: Array<WrongAnswer> = []
  readonly spans: Array<SlotSpan> = []
  /** Users whose usage the load cannot know exactly (a call of theirs failed). */
  readonly uncertain = new Set<string>()
  /** Per op, the times its calls were sent. */
  readonly sent = new Map<string, Array<number>>()
  /** The calls sent and not yet answered or failed: one that stays here never resolved. */
  readonly inFlight = new Set<{ readonly op: string; readonly user: string; readonly sentAt: number }>()
  readonly counts = { holdFlows: 0, granted: 0, refused: 0, slotFlows: 0, acquired: 0, busy: 0 }
  private readonly holdUsers: Array<UserSlot> = []
  private readonly slotUsers: Array<string> = []
  private running = false
  private workers: Promise<void> = Promise.resolve()
  private generations = 0
  private longestCallMs = 0

  private constructor(
    readonly client: QuotaClient,
    private readonly options: FlowLoadOptions
  ) {}

  static async start(options: FlowLoadOptions): Promise<FlowLoad> {
    const { partitions } = options
    const client = await QuotaClient.connect({
      servers: options.servers,
      prefix: options.prefix,
      partitions,
      // Generous enough for a takeover: attempts every 25..250 ms, 1 s per attempt, for ~60 attempts.
      timeoutMs: 1_000,
      retry: { attemptsMax: 60, baseDelayMs: 25, delayMsMax: 250, ...options.retry }
    })
    const load = new FlowLoad(client, options)
    for (let partition = 0; partition < partitions; partition += 1) {
      for (let index = 0; index < options.holdUsersPerPartition; index += 1) {
        const slot: UserSlot = { user: "", ready: Promise.resolve(), generation: 0, refusals: 0 }
        load.activate(slot, partition)
        load.holdUsers.push(slot)
      }
      for (let index = 0; index < options.slotUsersPerPartition; index += 1)
        load.slotUsers.push(userOnPartition(`${options.label}s`, partition, index, partitions))
    }
    await Promise.all(load.holdUsers.map((slot) => slot.ready))
    // Every slot user made resident in its owner's memory before the load starts.
    await Promise.all(
      load.slotUsers.map((user) => load.call("get_usage", user, () => client.getUsage({ user })))
    )
    load.running = true
    load.workers = Promise.all(
      Array.from({ length: options.workers }, (_, index) => load.worker(index))
    ).then(() => undefined)
    return load
  }

  private activate(slot: UserSlot, partition: number): void {
    const generation = (this.generations += 1)
    const user = userOnPartition(`${this.options.label}h`, partition, generation, this.options.partitions)
    slot.user = user
    slot.generation = generation
    slot.refusals = 0
    const limit = this.options.holdLimit ?? holdLimit
    slot.ready = this.call("set_limit", user, () => this.client.setLimit({ user, meter, limit })).then(
      (result) => {
        if (result?.status === "ok") this.limits.set(user, limit)
        else if (result !== undefined) this.wrong("set_limit", user, "", result.status)
      }
    )
  }

  private wrong(op: string, user: string, what: string, status: string): void {
    this.wrongAnswers.push({ at: Date.now(), op, user, what, status })
  }

  private async call<R extends { status: string }>(
    op: string,
    user: string,
    run: () => Promise<R>
  ): Promise<R | undefined> {
    const started = Date.now()
    const times = this.sent.get(op) ?? []
    times.push(started)
    this.sent.set(op, times)
    const pending = { op, user, sentAt: started }
    this.inFlight.add(pending)
    try {
      return await run()
    } catch (error) {
      this.failures.push({
        at: Date.now(),
        sentAt: started,
        op,
        user,
        what: error instanceof Error ? `${error.name}: ${error.message}` : String(error)
      })
      this.uncertain.add(user)
      return undefined
    } finally {
      this.inFlight.delete(pending)
      this.longestCallMs = Math.max(this.longestCallMs, Date.now() - started)
    }
  }

  private async worker(index: number): Promise<void> {
    const random = makeRng(this.options.seed * 1_000 + index).next
    for (let sequence = 0; this.running; sequence += 1) {
      if (random() < 0.5) await this.holdFlow(`w${index}-${sequence}`, random)
      else await this.slotFlow(`w${index}-${sequence}`, random)
    }
  }

  /** reserve → consume (key c1) → extend → consume (key c2) → commit of the whole amount. */
  private async holdFlow(id: string, random: () => number): Promise<void> {
    const slot = this.holdUsers[Math.floor(random() * this.holdUsers.length)]!
    await slot.ready
    const { user, generation } = slot
    if (!this.limits.has(user)) {
      await sleep(10)
      return
    }
    this.counts.holdFlows += 1
    const amount = 2 + Math.floor(random() * 4)
    const reserved = await this.call("reserve", user, () =>
      this.client.reserve({ user, meter, amount, id, ttlMs: holdTtlMs })
    )
    if (reserved === undefined) return
    if (reserved.status === "insufficient_quota") {
      this.counts.refused += 1
      slot.refusals += 1
      const available = "available" in reserved ? reserved.available : 0
      if ((available < 2 || slot.refusals >= 3) && slot.generation === generation)
        this.activate(slot, partitionOf(user, this.options.partitions))
      return
    }
    if (reserved.status !== "reserved" && reserved.status !== "exists") {
      this.wrong("reserve", user, id, reserved.status)
      return
    }
    this.counts.granted += 1
    this.acknowledged.holds.set(`${user}/${id}`, { user, id, amount })
    const first = Math.floor(amount / 2)
    const consume = async (key: string, part: number) => {
      const consumed = await this.call("consume", user, () =>
        this.client.consume({ user, id, amount: part, key })
      )
      if (consumed === undefined) return
      if (consumed.status === "consumed" || consumed.status === "exists")
        this.consumes.set(`${user}/${id}/${key}`, { user, id, key, amount: part })
      else this.wrong("consume", user, `${id} key ${key}`, consumed.status)
    }
    await consume(`${id}-c1`, first)
    const extended = await this.call("extend", user, () => this.client.extend({ user, id, ttlMs: holdTtlMs }))
    if (extended !== undefined && extended.status !== "extended")
      this.wrong("extend", user, id, extended.status)
    await consume(`${id}-c2`, amount - first)
    // Committed whatever the answers before: the hold is pending, and the checks want it closed.
    const committed = await this.call("commit", user, () => this.client.commit({ user, id, amount }))
    if (committed === undefined) return
    if (committed.status === "committed" || committed.status === "exists")
      this.acknowledged.commits.set(`${user}/${id}`, { user, id, amount })
    else this.wrong("commit", user, id, committed.status)
  }

  /** acquire_slot → renew_slot → release_slot. */
  private async slotFlow(job: string, random: () => number): Promise<void> {
    const user = this.slotUsers[Math.floor(random() * this.slotUsers.length)]!
    this.counts.slotFlows += 1
    const acquired = await this.call("acquire_slot", user, () =>
      this.client.acquireSlot({ user, job, leaseMs: slotLeaseMs })
    )
    if (acquired === undefined) return
    if (acquired.status === "busy") {
      this.counts.busy += 1
      return
    }
    if (acquired.status !== "acquired" && acquired.status !== "exists") {
      this.wrong("acquire_slot", user, job, acquired.status)
      return
    }
    this.counts.acquired += 1
    const span: SlotSpan = { user, job, grantedAt: Date.now() }
    this.spans.push(span)
    const renewed = await this.call("renew_slot", user, () =>
      this.client.renewSlot({ user, job, leaseMs: slotLeaseMs })
    )
    if (renewed !== undefined && renewed.status !== "renewed")
      this.wrong("renew_slot", user, job, renewed.status)
    span.releaseSentAt = Date.now()
    const released = await this.call("release_slot", user, () => this.client.releaseSlot({ user, job }))
    if (released === undefined) return
    span.releaseStatus = released.status
    // `not_found` is judged against Postgres at the end: right only if an earlier attempt released it.
    if (released.status !== "released" && released.status !== "not_found")
      this.wrong("release_slot", user, job, released.status)
  }

  async stop(): Promise<{ longestCallMs: number; retries: number }> {
    this.running = false
    await this.workers
    await Promise.all(this.holdUsers.map((slot) => slot.ready))
    const counters = this.client.counters()
    await this.client.close()
    return { longestCallMs: this.longestCallMs, retries: counters.retries }
  }

  snapshot(): AcknowledgedWrites {
    return {
      holds: new Map(this.acknowledged.holds),
      commits: new Map(this.acknowledged.commits),
      releases: new Map(this.acknowledged.releases),
      adjustments: new Map(this.acknowledged.adjustments)
    }
  }

  /** How many calls of each op were sent within [from, to). */
  sentBetween(from: number, to: number): Record<string, number> {
    return Object.fromEntries(
      [...this.sent].map(([op, times]) => [op, times.filter((time) => time >= from && time < to).length])
    )
  }
}

/**
 * What Postgres says of the slots and consumes: slots still held (a release answered `not_found` while
 * the slot stayed is a wrong answer; any other is a flow left unfinished), consumes acknowledged but
 * not in the ledger, usage that differs from what the clients were charged, slots granted beyond the
 * limit as the clients saw them.
 */
export const slotsAndCharges = async (pool: pg.Pool, load: FlowLoad) => {
  await tablesUpToDate(pool)
  const violations: Array<string> = []
  const wrong: Array<WrongAnswer> = []
  const held = await pool.query<{ user_id: string; job: string }>("select user_id, job from quota.slots")
  const stillHeld = new Set(held.rows.map((row) => `${row.user_id}/${row.job}`))
  for (const span of load.spans) {
    const key = `${span.user}/${span.job}`
    if (!stillHeld.has(key)) continue
    if (span.releaseStatus === "not_found")
      wrong.push({
        at: span.releaseSentAt ?? 0,
        op: "release_slot",
        user: span.user,
        what: `${span.job}: answered not_found, the slot is still held in Postgres`,
        status: "not_found"
      })
    else violations.push(`slot ${key} still held (release: ${span.releaseStatus ?? "not answered"})`)
  }
  // Over-grant of slots: per user, the spans [granted, release sent] (to the end if the release did not
  // take) may never overlap more than the limit.
  const byUser = new Map<string, Array<[number, number]>>()
  for (const span of load.spans) {
    const released = span.releaseSentAt !== undefined && !stillHeld.has(`${span.user}/${span.job}`)
    const events = byUser.get(span.user) ?? []
    events.push([span.grantedAt, 1])
    if (released) events.push([span.releaseSentAt!, -1])
    byUser.set(span.user, events)
  }
  for (const [user, events] of byUser) {
    events.sort((left, right) => left[0] - right[0] || left[1] - right[1])
    let holding = 0
    for (const [at, delta] of events) {
      holding += delta
      if (holding > slotLimit) {
        violations.push(`${user}: ${holding} slots held at once at ${at} (limit ${slotLimit})`)
        break
      }
    }
  }
  const ledger = await pool.query<{
    user_id: string
    hold_id: string
    key: string
    requested: string
  }>("select user_id, hold_id, key, requested::text from quota.usage_ledger where operation = 'consume'")
  const applied = new Map(
    ledger.rows.map((row) => [`${row.user_id}/${row.hold_id}/${row.key}`, Number(row.requested)])
  )
  for (const [key, consume] of load.consumes)
    if (applied.get(key) !== consume.amount)
      violations.push(`acknowledged consume ${key} of ${consume.amount} not in the ledger`)
  // Usage: every hold of a user whose calls all resolved is committed at its amount, so `used` is their sum.
  const expected = new Map<string, number>()
  for (const hold of load.acknowledged.holds.values())
    expected.set(hold.user, (expected.get(hold.user) ?? 0) + hold.amount)
  const totals = await pool.query<{ user_id: string; used: string }>(
    "select user_id, sum(used)::text as used from quota.usage_totals where meter = $1 group by user_id",
    [meter]
  )
  const used = new Map(totals.rows.map((row) => [row.user_id, Number(row.used)]))
  for (const [user, amount] of expected) {
    if (load.uncertain.has(user)) continue
    if ((used.get(user) ?? 0) !== amount)
      violations.push(`${user}: used ${used.get(user) ?? 0}, clients were charged ${amount}`)
  }
  return { violations, wrong }
}

export interface LogAnswer {
  readonly time: number
  readonly partition: number
  readonly op: string
  readonly status: string
  readonly user: string
}

/** Every claim logged by any member: partition -> [time, owner] in time order. */
export const claimsOf = (members: ReadonlyArray<Member>): Map<number, Array<[number, string]>> => {
  const claims = new Map<number, Array<[number, string]>>()
  for (const member of members)
    for (const entry of logEntries(member.serve))
      if (entry.msg === "claimed partitions")
        for (const partition of entry["partitions"] as Array<number>)
          claims.set(partition, [...(claims.get(partition) ?? []), [entry.time, member.owner]])
  for (const list of claims.values()) list.sort((left, right) => left[0] - right[0])
  return claims
}

/**
 * The cut process's answers from `since` on, other than `unavailable`, for a partition whose latest
 * claim (by log time) was another process's: answers from memory that a new owner had moved past.
 */
export const staleAnswersOf = (
  cut: Member,
  members: ReadonlyArray<Member>,
  since: number,
  partitions: number
): Array<LogAnswer> => {
  const claims = claimsOf(members)
  const stale: Array<LogAnswer> = []
  for (const entry of logEntries(cut.serve)) {
    const user = entry["user"]
    if (entry.time < since || typeof entry["op"] !== "string" || typeof user !== "string") continue
    if (entry["status"] === "unavailable") continue
    const partition = partitionOf(user, partitions)
    const latest = (claims.get(partition) ?? []).filter(([time]) => time <= entry.time).at(-1)
    if (latest !== undefined && latest[1] !== cut.owner)
      stale.push({ time: entry.time, partition, op: entry["op"], status: String(entry["status"]), user })
  }
  return stale
}

export const countBy = (values: ReadonlyArray<string>): Record<string, number> => {
  const counts: Record<string, number> = {}
  for (const value of values) counts[value] = (counts[value] ?? 0) + 1
  return counts
}

/**
 * What every flow test checks once its load has stopped: the clients' wrong answers (their own flows'
 * and the slots' and charges' against Postgres), over-grants as the clients saw them, checkDatabase,
 * Postgres against the clients. `since` is the fault's moment, for the report.
 */
export const flowSafety = async (pool: pg.Pool, load: FlowLoad, since: number, partitions: number) => {
  const database = await checkDatabase(pool, load.snapshot())
  const overGrants = clientOverGrants(load)
  const mismatches = await databaseAgainstClients(pool, load)
  const slots = await slotsAndCharges(pool, load)
  const wrongAnswers = [...load.wrongAnswers, ...slots.wrong].sort((left, right) => left.at - right.at)
  const describeWrong = wrongAnswers
    .slice(0, 20)
    .map(
      (answer) =>
        `+${answer.at - since} ms ${answer.op} ${answer.user} (partition ${partitionOf(answer.user, partitions)}) ${answer.what}: ${answer.status}`
    )
    .join("\n")
  return { database, overGrants, mismatches, slots, wrongAnswers, describeWrong }
}

export type FlowSafety = Awaited<ReturnType<typeof flowSafety>>

/** The clients' wrong answers, counted by operation and status. */
export const describeWrongCounts = (safety: FlowSafety): string =>
  `${safety.wrongAnswers.length} ` +
  `${JSON.stringify(countBy(safety.wrongAnswers.map((answer) => `${answer.op} ${answer.status}`)))}`

export const describeViolations = (safety: FlowSafety): string =>
  `violations: ${safety.overGrants.length} over-grants seen by clients, ${safety.database.violations.length} from ` +
  `checkDatabase, ${safety.mismatches.length} Postgres vs clients, ${safety.slots.violations.length} slots and charges`

/** No wrong answer, no over-grant, nothing in Postgres that the clients were not told, and the reverse. */
export const expectFlowSafety = (safety: FlowSafety, summary: string): void => {
  expect(safety.wrongAnswers, `${summary}\n${safety.describeWrong}`).toEqual([])
  expect(safety.overGrants, summary).toEqual([])
  expect(safety.database.violations, summary).toEqual([])
  expect(safety.mismatches, summary).toEqual([])
  expect(safety.slots.violations, summary).toEqual([])
}
