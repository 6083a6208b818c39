/**
 * The nemesis's load: the hold flows and slot flows of test/cluster/flows.ts (reserve, consume,
 * extend, consume, commit; acquire, renew, release) on tight per-user limits, and, when `timed`, half
 * of them time-driven: holds of 1-3 s and slot leases of 1-3 s, some left to run out mid-flow and some
 * abandoned (released by expiry, not by the client), so that expiry, `hold_expired` and `slot_expired`
 * happen under the faults. Flows read too (`get_usage`, `list_holds`) between their steps. Every call
 * is recorded (history.ts) for the model (model.ts) to judge; the load itself judges nothing.
 */
import { makeRng } from "../../bench/lib/rng.js"
import { QuotaClient } from "../../src/client/QuotaClient.js"
import { partitionOf } from "../../src/domain/partition.js"
import type { AcknowledgedWrites } from "../support/databaseChecks.js"
import type { LoadFailure } from "../cluster/cluster.js"
import { meter, sleep, userOnPartition } from "../cluster/cluster.js"
import { holdLimit } from "../cluster/flows.js"
import type { Call, CallOp, Reply } from "./history.js"

/** Holds and slot leases of flows that are not time-driven: long enough never to run out in a run. */
const holdTtlMsLong = 600_000
const slotLeaseMsLong = 120_000
/** The time-driven ones: 1-3 s, so expiry happens within a run, through the faults. */
const timedMsRange = [1_000, 3_000] as const

export interface NemesisLoadOptions {
  readonly servers: string
  readonly prefix: string
  readonly partitions: number
  readonly label: string
  readonly workers: number
  readonly holdUsersPerPartition: number
  readonly slotUsersPerPartition: number
  readonly seed: number
  readonly retry: { readonly attemptsMax: number; readonly delayMsMax: number }
  /** Half the flows time-driven (1-3 s holds and leases, some run out or abandoned). */
  readonly timed: boolean
  /** The world's clock: what the history's times are read on. */
  readonly now: () => number
}

interface HoldUser {
  user: string
  ready: Promise<void>
  generation: number
  refusals: number
}

export class NemesisLoad {
  /** Every call, in the order sent. */
  readonly calls: Array<Call> = []
  readonly callsByUser = new Map<string, Array<Call>>()
  /** In the shape checkDatabase takes: what clients were told is durable. */
  readonly acknowledged = {
    holds: new Map<string, { user: string; id: string; amount: number }>(),
    commits: new Map<string, { user: string; id: string; amount: number }>(),
    releases: new Map<string, { user: string; id: string }>(),
    adjustments: new Map<string, { user: string; id: string }>()
  }
  /** Hold users whose limit was acknowledged, with it. */
  readonly limits = new Map<string, number>()
  readonly slotUsers: Array<string> = []
  readonly failures: Array<LoadFailure> = []
  /** Users a call of which failed: what it did is unknown for good. */
  readonly uncertain = new Set<string>()
  readonly inFlight = new Set<Call>()
  readonly counts = { holdFlows: 0, granted: 0, refused: 0, slotFlows: 0, acquired: 0, busy: 0, reads: 0 }
  private readonly holdUsers: Array<HoldUser> = []
  private running = false
  private workers: Promise<void> = Promise.resolve()
  private generations = 0

  private constructor(
    readonly client: QuotaClient,
    private readonly options: NemesisLoadOptions
  ) {}

  static async start(options: NemesisLoadOptions): Promise<NemesisLoad> {
    const client = await QuotaClient.connect({
      servers: options.servers,
      prefix: options.prefix,
      partitions: options.partitions,
      timeoutMs: 1_000,
      retry: { baseDelayMs: 25, ...options.retry }
    })
    const load = new NemesisLoad(client, options)
    for (let partition = 0; partition < options.partitions; partition += 1) {
      for (let index = 0; index < options.holdUsersPerPartition; index += 1) {
        const slot: HoldUser = { user: "", ready: Promise.resolve(), generation: 0, refusals: 0 }
        load.activate(slot, partition)
        load.holdUsers.push(slot)
      }
      for (let index = 0; index < options.slotUsersPerPartition; index += 1)
        load.slotUsers.push(userOnPartition(`${options.label}s`, partition, index, options.partitions))
    }
    await Promise.all(load.holdUsers.map((slot) => slot.ready))
    load.running = true
    load.workers = Promise.all(
      Array.from({ length: options.workers }, (_, index) => load.worker(index))
    ).then(() => undefined)
    return load
  }

  /** A fresh hold user of `partition` in `slot`, its limit set first. */
  private activate(slot: HoldUser, partition: number): void {
    const generation = (this.generations += 1)
    const user = userOnPartition(`${this.options.label}h`, partition, generation, this.options.partitions)
    slot.user = user
    slot.generation = generation
    slot.refusals = 0
    slot.ready = this.call("set_limit", user, "", { limit: holdLimit }, () =>
      this.client.setLimit({ user, meter, limit: holdLimit })
    ).then((reply) => {
      if (reply?.status === "ok") this.limits.set(user, holdLimit)
    })
  }

  /** Runs one SDK call and records it; undefined when it failed (its retries ran out). */
  private async call(
    op: CallOp,
    user: string,
    flow: string,
    input: Record<string, number | string>,
    run: () => Promise<{ status: string }>
  ): Promise<Reply | undefined> {
    const call: Call = { index: this.calls.length, op, user, flow, input, sentAt: this.options.now() }
    this.calls.push(call)
    const ofUser = this.callsByUser.get(user) ?? []
    ofUser.push(call)
    this.callsByUser.set(user, ofUser)
    this.inFlight.add(call)
    const sentAt = Date.now()
    try {
      const reply = (await run()) as Reply
      call.reply = reply
      return reply
    } catch (error) {
      call.failed = error instanceof Error ? `${error.name}: ${error.message}` : String(error)
      this.failures.push({ at: Date.now(), sentAt, op, user, what: call.failed })
      this.uncertain.add(user)
      return undefined
    } finally {
      call.repliedAt = this.options.now()
      this.inFlight.delete(call)
    }
  }

  private async worker(index: number): Promise<void> {
    const random = makeRng(this.options.seed * 1_000 + index).next
    for (let sequence = 0; this.running; sequence += 1) {
      if (random() < 0.5) await this.holdFlow(`w${index}-${sequence}`, random)
      else await this.slotFlow(`w${index}-${sequence}`, random)
    }
  }

  /** 1-3 s when time-driven (half the flows of a timed load), else long enough never to run out. */
  private duration(random: () => number, longMs: number): { ms: number; timed: boolean } {
    if (!this.options.timed || random() < 0.5) return { ms: longMs, timed: false }
    const [shortest, longest] = timedMsRange
    return { ms: Math.round(shortest + random() * (longest - shortest)), timed: true }
  }

  /** Now and then a read of the user between two steps: each is judged against the model. */
  private async read(user: string, random: () => number, holds: boolean): Promise<void> {
    const draw = random()
    if (draw < 0.25) {
      this.counts.reads += 1
      await this.call("get_usage", user, "", {}, () => this.client.getUsage({ user }))
    } else if (holds && draw < 0.35) {
      this.counts.reads += 1
      await this.call("list_holds", user, "", {}, () => this.client.listHolds({ user }))
    }
  }

  /**
   * reserve → consume → (a wait past the TTL, now and then) → extend → consume → commit, release, or
   * nothing (a time-driven hold abandoned: it must expire). Any step's failure ends the flow.
   */
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
    const ttl = this.duration(random, holdTtlMsLong)
    const ending = random()
    const reserved = await this.call("reserve", user, id, { amount, ttlMs: ttl.ms }, () =>
      this.client.reserve({ user, meter, amount, id, ttlMs: ttl.ms })
    )
    if (reserved === undefined) return
    if (reserved.status === "insufficient_quota") {
      this.counts.refused += 1
      slot.refusals += 1
      const available = typeof reserved["available"] === "number" ? reserved["available"] : 0
      if ((available < 2 || slot.refusals >= 3) && slot.generation === generation)
        this.activate(slot, partitionOf(user, this.options.partitions))
      return
    }
    if (reserved.status !== "reserved" && reserved.status !== "exists") return
    this.counts.granted += 1
    this.acknowledged.holds.set(`${user}/${id}`, { user, id, amount })
    const first = Math.floor(amount / 2)
    const consume = (key: string, part: number) =>
      this.call("consume", user, id, { amount: part, key }, () =>
        this.client.consume({ user, id, amount: part, key })
      )
    if ((await consume(`${id}-c1`, first)) === undefined) return
    await this.read(user, random, true)
    // Past the TTL now and then: the next steps meet a hold that may have expired.
    if (ttl.timed && random() < 0.4) await sleep(random() * 1.5 * ttl.ms)
    if (random() < 0.7) {
      const extended = await this.call("extend", user, id, { ttlMs: ttl.ms }, () =>
        this.client.extend({ user, id, ttlMs: ttl.ms })
      )
      if (extended === undefined) return
    }
    if ((await consume(`${id}-c2`, amount - first)) === undefined) return
    await this.read(user, random, true)
    if (ttl.timed && ending < 0.25) return
    if (ending < 0.85) {
      const committed = await this.call("commit", user, id, { amount }, () =>
        this.client.commit({ user, id, amount })
      )
      if (committed?.status === "committed" || committed?.status === "exists")
        this.acknowledged.commits.set(`${user}/${id}`, { user, id, amount })
    } else {
      const released = await this.call("release", user, id, {}, () => this.client.release({ user, id }))
      if (released?.status === "released" || released?.status === "exists")
        this.acknowledged.releases.set(`${user}/${id}`, { user, id })
    }
  }

  /** acquire_slot → (a wait past the lease, now and then) → renew_slot → release_slot, or abandoned. */
  private async slotFlow(job: string, random: () => number): Promise<void> {
    const user = this.slotUsers[Math.floor(random() * this.slotUsers.length)]!
    this.counts.slotFlows += 1
    const lease = this.duration(random, slotLeaseMsLong)
    const abandoned = lease.timed && random() < 0.25
    const acquired = await this.call("acquire_slot", user, job, { leaseMs: lease.ms }, () =>
      this.client.acquireSlot({ user, job, leaseMs: lease.ms })
    )
    if (acquired === undefined) return
    if (acquired.status === "busy") {
      this.counts.busy += 1
      return
    }
    if (acquired.status !== "acquired" && acquired.status !== "exists") return
    this.counts.acquired += 1
    await this.read(user, random, false)
    if (lease.timed && random() < 0.4) await sleep(random() * 1.5 * lease.ms)
    if (random() < 0.8) {
      const renewed = await this.call("renew_slot", user, job, { leaseMs: lease.ms }, () =>
        this.client.renewSlot({ user, job, leaseMs: lease.ms })
      )
      if (renewed === undefined) return
    }
    if (abandoned) return
    await this.call("release_slot", user, job, {}, () => this.client.releaseSlot({ user, job }))
  }

  async stop(): Promise<{ retries: number }> {
    this.running = false
    await this.workers
    await Promise.all(this.holdUsers.map((slot) => slot.ready))
    const counters = this.client.counters()
    await this.client.close()
    return { retries: counters.retries }
  }

  snapshot(): AcknowledgedWrites {
    return {
      holds: new Map(this.acknowledged.holds),
      commits: new Map(this.acknowledged.commits),
      releases: new Map(this.acknowledged.releases),
      adjustments: new Map(this.acknowledged.adjustments)
    }
  }

  /** How many calls of each op were sent. */
  sentCounts(): Record<string, number> {
    const counts: Record<string, number> = {}
    for (const call of this.calls) counts[call.op] = (counts[call.op] ?? 0) + 1
    return counts
  }
}
