/** The demo's load run: reserve then commit in batches per partition, checked from the replies alone. */
import { randomBytes, randomInt as cryptoRandomInt } from "node:crypto"
import { partitionOf } from "../domain/partition.js"
import type { Wire } from "./demoOutput.js"
import { grouped, seconds } from "./demoOutput.js"

// ---------------------------------------------------------------------------------------------------
// Load run

export const loadDefaults = {
  messagesInFlight: 64,
  commandsPerMessage: 32,
  usersPerWorker: 16,
  amountMin: 1_000,
  amountMax: 20_000,
  /** One user per worker gets this lower limit (set_limit), so refusals happen throughout the run. */
  tightLimit: 50_000
} as const

export interface LoadReport {
  readonly users: number
  /** Users on the tight limit. */
  readonly tightUsers: number
  readonly messagesInFlight: number
  readonly commandsPerMessage: number
  /** How long loading every user (get_usage, set_limit) took before the clock started. */
  readonly warmUpMs: number
  readonly commands: number
  readonly messages: number
  readonly elapsedMs: number
  /** Per message, sorted. */
  readonly latenciesMs: ReadonlyArray<number>
  readonly granted: number
  readonly committed: number
  readonly refused: number
  /** Statuses other than the expected ones (unavailable, overloaded, ...), by status. */
  readonly other: Readonly<Record<string, number>>
  readonly failedMessages: number
  /** A `reserved` that took the client's own ledger of the user past the limit. */
  readonly overGrants: number
  /** An `insufficient_quota` where the client's ledger says the hold fitted. */
  readonly wrongfulRefusals: number
  /** Replies whose meter state (limit, used, reserved) differs from the client's ledger. */
  readonly ledgerMismatches: number
}

export interface LoadOptions {
  readonly wire: Wire
  readonly prefix: string
  readonly partitions: number
  /** The plan's limit of `meter` for a new user. */
  readonly limit: number
  readonly meter: string
  readonly durationMs: number
  /** Stop after about this many commands instead of after durationMs. */
  readonly requests: number | undefined
  readonly messagesInFlight?: number
  readonly commandsPerMessage?: number
  readonly usersPerWorker?: number
  /** Each hold's amount is drawn from this range; the commit is 50-100% of it. */
  readonly amountMin?: number
  readonly amountMax?: number
  readonly tightLimit?: number
  /** Called about every 100 ms of the timed run with how far it is (0..1) and the commands answered. */
  readonly onProgress?: (fraction: number, commands: number, elapsedMs: number) => void
  /** Called when the users are loaded, just before the clock starts. */
  readonly onWarmedUp?: (warmUpMs: number) => void
}

export interface Ledger {
  readonly limit: number
  used: number
  reserved: number
  /** A reply this client cannot account for (unavailable, a lost message): stop checking this user. */
  uncertain: boolean
}

interface PendingHold {
  readonly user: string
  readonly id: string
  readonly amount: number
}

type WireResultObject = Record<string, unknown>

/** Fresh users, `count` of them hashing to `partition`. */
const usersIn = (partition: number, partitions: number, count: number, tag: string): Array<string> => {
  const users: Array<string> = []
  for (let serial = 0; users.length < count; serial += 1) {
    const user = `load-${tag}-${serial}`
    if (partitionOf(user, partitions) === partition) users.push(user)
  }
  return users
}

/** From min to max, both included. */
const randomInt = (min: number, max: number): number => cryptoRandomInt(min, max + 1)

const requestBatch = async (
  wire: Wire,
  subject: string,
  commands: ReadonlyArray<WireResultObject>
): Promise<Array<WireResultObject>> => {
  const results: unknown = JSON.parse(await wire.request(subject, JSON.stringify(commands)))
  if (!Array.isArray(results) || results.length !== commands.length)
    throw new Error(`a batch of ${commands.length} got ${JSON.stringify(results).slice(0, 200)}`)
  return results as Array<WireResultObject>
}

/**
 * `messagesInFlight` workers, each owning its own fresh users in one partition and sending one batch at
 * a time: commits of the holds its previous batch was granted, then new reserves round-robin over its
 * users. A user belongs to one worker, so the worker knows the order its commands were decided in and
 * keeps its own ledger of each user's `used` and `reserved` from the replies alone; every grant and
 * every refusal is checked against it. Before the clock starts, each worker loads its users (get_usage)
 * and puts one of them on a tight limit (set_limit), so that refusals happen throughout the run.
 */
export const runLoad = async (options: LoadOptions): Promise<LoadReport> => {
  const messagesInFlight = options.messagesInFlight ?? loadDefaults.messagesInFlight
  const commandsPerMessage = options.commandsPerMessage ?? loadDefaults.commandsPerMessage
  const usersPerWorker = options.usersPerWorker ?? loadDefaults.usersPerWorker
  const amountMin = options.amountMin ?? loadDefaults.amountMin
  const amountMax = options.amountMax ?? loadDefaults.amountMax
  const tightLimit = options.tightLimit ?? loadDefaults.tightLimit
  const { meter, partitions, wire } = options
  const tag = randomBytes(4).toString("hex")
  let reservesSent = 0
  let answered = 0
  let messages = 0
  let granted = 0
  let committed = 0
  let refused = 0
  let failedMessages = 0
  let overGrants = 0
  let wrongfulRefusals = 0
  let ledgerMismatches = 0
  const other: Record<string, number> = {}
  const latencies: Array<number> = []
  const ledgers = new Map<string, Ledger>()

  const checkState = (ledger: Ledger, result: WireResultObject) => {
    if (ledger.uncertain) return
    if (
      result["limit"] !== ledger.limit ||
      result["used"] !== ledger.used ||
      result["reserved"] !== ledger.reserved
    )
      ledgerMismatches += 1
  }

  interface Worker {
    readonly users: ReadonlyArray<string>
    readonly subject: string
  }

  const prepare = async (index: number): Promise<Worker> => {
    const partition = index % partitions
    const users = usersIn(partition, partitions, usersPerWorker, `${tag}-${index}`)
    const [tight] = users
    if (tight === undefined) throw new Error("a load worker needs at least one user")
    const subject = `${options.prefix}.v1.${partition}.ops`
    const [limited] = await requestBatch(wire, `${options.prefix}.v1.${partition}.admin`, [
      { op: "set_limit", user: tight, meter, limit: tightLimit }
    ])
    if (limited?.["status"] !== "ok") throw new Error(`set_limit answered ${JSON.stringify(limited)}`)
    const usages = await requestBatch(
      wire,
      subject,
      users.map((user) => ({ op: "get_usage", user }))
    )
    for (const [position, user] of users.entries()) {
      const meters = usages[position]?.["meters"]
      const state = Array.isArray(meters)
        ? (meters as Array<WireResultObject>).find((entry) => entry["meter"] === meter)
        : undefined
      const expectedLimit = user === tight ? tightLimit : options.limit
      if (state?.["limit"] !== expectedLimit || state["used"] !== 0 || state["reserved"] !== 0)
        throw new Error(`a fresh user's usage is not empty: ${JSON.stringify(usages[position])}`)
      ledgers.set(user, { limit: expectedLimit, used: 0, reserved: 0, uncertain: false })
    }
    return { users, subject }
  }

  const warmUpStartedAt = performance.now()
  const workers = await Promise.all(Array.from({ length: messagesInFlight }, (_, index) => prepare(index)))
  const startedAt = performance.now()
  const warmUpMs = startedAt - warmUpStartedAt
  options.onWarmedUp?.(warmUpMs)
  const deadline = performance.now() + options.durationMs

  const timedFrom = performance.now()
  // Every granted reserve is followed by its commit: N commands are about N / 2 reserves.
  const reservesMax = options.requests === undefined ? Infinity : Math.ceil(options.requests / 2)
  const stopping = () =>
    options.requests === undefined ? performance.now() >= deadline : reservesSent >= reservesMax

  const run = async (worker: Worker, index: number): Promise<void> => {
    const { users, subject } = worker
    let pending: Array<PendingHold> = []
    let next = 0
    for (;;) {
      const last = stopping()
      if (last && pending.length === 0) return
      const commits = pending.map((hold) => ({
        op: "commit",
        user: hold.user,
        id: hold.id,
        // The work's actual usage: at most what was held.
        amount: randomInt(Math.ceil(hold.amount / 2), hold.amount)
      }))
      const reserves: Array<PendingHold> = []
      for (
        let size = commits.length;
        !last && size < commandsPerMessage && reservesSent < reservesMax;
        size += 1
      ) {
        reservesSent += 1
        const user = users[next % users.length] as string
        reserves.push({ user, id: `job-${index}-${next}`, amount: randomInt(amountMin, amountMax) })
        next += 1
      }
      const commands: Array<WireResultObject> = [
        ...commits,
        ...reserves.map((hold) => ({
          op: "reserve",
          user: hold.user,
          meter,
          amount: hold.amount,
          id: hold.id
        }))
      ]
      const holds = [...pending, ...reserves]
      pending = []
      const sentAt = performance.now()
      let results: Array<WireResultObject>
      try {
        results = await requestBatch(wire, subject, commands)
      } catch {
        failedMessages += 1
        for (const hold of holds) (ledgers.get(hold.user) as Ledger).uncertain = true
        continue
      }
      latencies.push(performance.now() - sentAt)
      messages += 1
      answered += commands.length
      for (const [position, command] of commands.entries()) {
        const hold = holds[position] as PendingHold
        const result = results[position] as WireResultObject
        const ledger = ledgers.get(hold.user) as Ledger
        const status = String(result["status"])
        if (command["op"] === "commit" && status === "committed") {
          committed += 1
          ledger.reserved -= hold.amount
          ledger.used += command["amount"] as number
          checkState(ledger, result)
        } else if (command["op"] === "reserve" && status === "reserved") {
          granted += 1
          ledger.reserved += hold.amount
          if (!ledger.uncertain && ledger.used + ledger.reserved > ledger.limit) overGrants += 1
          checkState(ledger, result)
          pending.push(hold)
        } else if (command["op"] === "reserve" && status === "insufficient_quota") {
          refused += 1
          if (!ledger.uncertain && ledger.used + ledger.reserved + hold.amount <= ledger.limit)
            wrongfulRefusals += 1
          checkState(ledger, result)
        } else {
          other[status] = (other[status] ?? 0) + 1
          ledger.uncertain = true
        }
      }
    }
  }

  const progress =
    options.onProgress === undefined
      ? undefined
      : setInterval(() => {
          const elapsed = performance.now() - timedFrom
          const fraction =
            options.requests === undefined ? elapsed / options.durationMs : answered / options.requests
          options.onProgress?.(Math.min(1, fraction), answered, elapsed)
        }, 100)
  try {
    await Promise.all(workers.map((worker, index) => run(worker, index)))
  } finally {
    if (progress !== undefined) clearInterval(progress)
  }
  return {
    users: messagesInFlight * usersPerWorker,
    tightUsers: messagesInFlight,
    messagesInFlight,
    commandsPerMessage,
    warmUpMs,
    commands: answered,
    messages,
    elapsedMs: performance.now() - timedFrom,
    latenciesMs: latencies.sort((left, right) => left - right),
    granted,
    committed,
    refused,
    other,
    failedMessages,
    overGrants,
    wrongfulRefusals,
    ledgerMismatches
  }
}

/** A progress bar redrawn in place on a terminal, or a plain line a second elsewhere. */
export const progressReporter = (stream: NodeJS.WriteStream) => {
  const width = 30
  let lastLineAt = 0
  return {
    update: (fraction: number, commands: number, elapsedMs: number) => {
      const rate = elapsedMs > 0 ? (commands * 1000) / elapsedMs : 0
      if (stream.isTTY) {
        const filled = Math.round(fraction * width)
        stream.write(
          `\r  [${"█".repeat(filled)}${"░".repeat(width - filled)}] ${String(Math.round(fraction * 100)).padStart(3)}%  ${grouped(commands)} commands  ${grouped(rate)}/s\u001b[K`
        )
      } else if (elapsedMs - lastLineAt >= 1_000) {
        lastLineAt = elapsedMs
        stream.write(`  ... ${seconds(elapsedMs)}: ${grouped(commands)} commands (${grouped(rate)}/s)\n`)
      }
    },
    done: () => {
      if (stream.isTTY) stream.write("\r\u001b[K")
    }
  }
}
