/**
 * `quota-coordinator demo`: the coordinator on embedded defaults, the seeds' races replayed against it,
 * then a short load run. Nothing to install but Node:
 *
 * - the database is an embedded Postgres (PGlite) in a fresh temporary directory, removed at the end,
 *   so no run sees an earlier run's data;
 * - the transport is NATS at NATS_URL when one answers within a second (under a random subject prefix,
 *   so a running service is never disturbed), else the in-process transport, which runs the same
 *   request handler as the NATS server;
 * - meters and plans are the built-in defaults, the seeds' numbers (QUOTA_CONFIG, DATABASE_URL and the
 *   FAIRNESS_* variables are ignored: the races are told with those numbers).
 *
 * Every request is JSON over a subject, exactly as any client in any language would send it.
 * Exit code 0 when every race came out as the protocol promises and the load run's replies add up.
 */
import { randomBytes, randomInt as cryptoRandomInt } from "node:crypto"
import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { connect } from "@nats-io/transport-node"
import type { NatsConnection } from "@nats-io/transport-node"
import { Context, Effect, Exit, Layer, Scope } from "effect"
import { parseDurationMs } from "../config/settings.js"
import type { Config } from "../domain/config.js"
import { partitionOf } from "../domain/partition.js"
import { embeddedPostgres } from "../store/embedded.js"
import type { Logger } from "../transport/log.js"
import { makeLogger } from "../transport/log.js"
import type { LocalTransportShape } from "../transport/LocalTransport.js"
import { LocalTransport, localTransportLayer } from "../transport/LocalTransport.js"
import { reasonOf } from "../transport/errors.js"
import type { Call } from "./demoScenarios.js"
import { scenarios } from "./demoScenarios.js"
import type { DatabaseTarget } from "./serve.js"
import { coordinatorLayerFor, loadSettingsAndConfig, serveLayers, storeLayerFor } from "./serve.js"

// ---------------------------------------------------------------------------------------------------
// Arguments

export interface DemoOptions {
  /** Stop the load run after about this many commands (reserves and commits); else run for durationMs. */
  readonly requests: number | undefined
  readonly durationMs: number
}

const defaultDurationMs = 3_000

export const parseDemoArgs = (args: ReadonlyArray<string>): DemoOptions | { readonly error: string } => {
  let requests: number | undefined
  let durationMs = defaultDurationMs
  for (let index = 0; index < args.length; index += 1) {
    const arg = args[index] as string
    const [name, inline] = arg.includes("=")
      ? [arg.slice(0, arg.indexOf("=")), arg.slice(arg.indexOf("=") + 1)]
      : [arg]
    const value = inline ?? args[index + 1]
    if (name === "--requests") {
      if (inline === undefined) index += 1
      const count = value !== undefined && /^\d+$/.test(value) ? Number(value) : NaN
      if (!Number.isSafeInteger(count) || count < 1)
        return { error: `--requests: expected a positive integer, got ${String(value)}` }
      requests = count
    } else if (name === "--duration") {
      if (inline === undefined) index += 1
      const ms = value === undefined ? undefined : parseDurationMs(value)
      if (ms === undefined || ms < 100 || ms > 600_000)
        return { error: `--duration: expected a duration from 100ms to 10m such as 3s, got ${String(value)}` }
      durationMs = ms
    } else {
      return { error: `unknown argument: ${arg}` }
    }
  }
  return { requests, durationMs }
}

// ---------------------------------------------------------------------------------------------------
// Output

const color = (enabled: boolean) => {
  const wrap = (code: string) => (text: string) => (enabled ? `\u001b[${code}m${text}\u001b[0m` : text)
  return { green: wrap("32"), red: wrap("31"), bold: wrap("1"), dim: wrap("2") }
}

/** 4985 -> "4 985", as the seeds write numbers. */
export const grouped = (value: number): string =>
  Math.round(value)
    .toString()
    .replace(/\B(?=(\d{3})+(?!\d))/g, " ")

const seconds = (ms: number): string => `${(ms / 1000).toFixed(1)} s`

const milliseconds = (ms: number): string => `${ms < 10 ? ms.toFixed(1) : Math.round(ms)} ms`

const percentile = (sorted: ReadonlyArray<number>, fraction: number): number =>
  sorted.length === 0
    ? 0
    : (sorted[Math.min(sorted.length - 1, Math.floor(fraction * sorted.length))] as number)

// ---------------------------------------------------------------------------------------------------
// The wire: NATS or in-process, the same subjects and bytes

/** Sends a request body to a subject and resolves with the reply body; a service error rejects. */
export interface Wire {
  readonly request: (subject: string, body: string) => Promise<string>
}

const serviceError = (headers: { get(name: string): string } | undefined): Error | undefined => {
  const code = headers?.get("Nats-Service-Error-Code") ?? ""
  return code === ""
    ? undefined
    : new Error(`service error ${code}: ${headers?.get("Nats-Service-Error") ?? ""}`)
}

export const natsWire = (connection: NatsConnection): Wire => ({
  request: async (subject, body) => {
    const msg = await connection.request(subject, body, { timeout: 30_000 })
    const error = serviceError(msg.headers)
    if (error !== undefined) throw error
    return msg.string()
  }
})

const decoder = new TextDecoder()

export const localWire = (transport: Pick<LocalTransportShape, "request">): Wire => ({
  request: async (subject, body) => {
    const reply = await transport.request(subject, body)
    const headers = reply.headers
    const error = serviceError(headers === undefined ? undefined : { get: (name) => headers[name] ?? "" })
    if (error !== undefined) throw error
    return decoder.decode(reply.data)
  }
})

/** NATS at `servers` if it answers within `timeoutMs`, else the reason it did not. */
const probeNats = async (
  servers: string,
  timeoutMs: number
): Promise<NatsConnection | { reason: string }> => {
  try {
    return await connect({
      servers: servers.split(",").map((server) => server.trim()),
      name: "quota-coordinator-demo",
      timeout: timeoutMs,
      reconnect: false
    })
  } catch (cause) {
    return { reason: reasonOf(cause) }
  }
}

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

interface Ledger {
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
const progressReporter = (stream: NodeJS.WriteStream) => {
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

// ---------------------------------------------------------------------------------------------------
// The coordinator on embedded defaults

interface Running {
  readonly wire: Wire
  readonly transport: string
  readonly prefix: string
  readonly partitions: number
  readonly config: Config
  readonly dataDirectory: string
}

/** Variables the demo does not read: it always runs the built-in defaults on a fresh embedded database. */
const ignoredVariables = [
  "DATABASE_URL",
  "QUOTA_CONFIG",
  "QUOTA_PREFIX",
  "QUOTA_PARTITIONS",
  "QUOTA_DATA_DIR",
  "FAIRNESS_ENABLED",
  "FAIRNESS_FREE_LIMIT",
  "FAIRNESS_PRO_LIMIT",
  "FAIRNESS_PRO_PLUS_LIMIT",
  "FAIRNESS_ENTERPRISE_LIMIT",
  "FAIRNESS_SNOOZE_DURATION",
  "FAIRNESS_SNOOZE_JITTER"
]

const start = (env: NodeJS.ProcessEnv, scope: Scope.Scope, logStream: NodeJS.WritableStream) =>
  Effect.gen(function* () {
    const natsUrl = env["NATS_URL"]?.trim() || "nats://127.0.0.1:4222"
    const prefix = `quota-demo-${randomBytes(4).toString("hex")}`
    const directory = yield* Effect.acquireRelease(
      Effect.promise(() => mkdtemp(join(tmpdir(), "quota-demo-"))),
      (path) => Effect.promise(() => rm(path, { recursive: true, force: true }))
    )
    const { settings, config } = yield* loadSettingsAndConfig({
      NATS_URL: natsUrl,
      LOG_LEVEL: env["LOG_LEVEL"]?.trim() || "warn",
      QUOTA_PREFIX: prefix,
      QUOTA_DATA_DIR: directory
    })
    const logger: Logger = makeLogger(settings.logLevel, logStream)
    // The NATS probe (up to a second) runs while the embedded database starts.
    const [probe, database] = yield* Effect.all(
      [
        Effect.acquireRelease(
          Effect.promise(() => probeNats(natsUrl, 1_000)),
          (connection) =>
            "reason" in connection
              ? Effect.void
              : Effect.promise(() => connection.close().catch(() => undefined))
        ),
        embeddedPostgres({ dataDirectory: join(directory, "pglite") })
      ],
      { concurrency: "unbounded" }
    )
    const onNats = !("reason" in probe)
    const target: DatabaseTarget = {
      connectionString: database.connectionString,
      poolMax: database.poolMax,
      embedded: true
    }
    let wire: Wire
    let transport: string
    if (onNats) {
      yield* Layer.build(serveLayers(settings, config, logger, target, undefined))
      wire = natsWire(probe)
      transport = `NATS at ${natsUrl}, subjects ${prefix}.v1.{0..${settings.partitions - 1}}.ops`
    } else {
      const store = storeLayerFor(settings, target)
      const coordinator = coordinatorLayerFor(config, logger, settings.partitions, undefined).pipe(
        Layer.provide(store)
      )
      const layer = localTransportLayer({ prefix, partitions: settings.partitions, logger }).pipe(
        Layer.provide(coordinator)
      )
      const context = yield* Layer.build(layer)
      wire = localWire(Context.get(context, LocalTransport))
      transport = `in-process (no NATS at ${natsUrl}: ${probe.reason}); same request handler as the NATS service`
    }
    return {
      wire,
      transport,
      prefix,
      partitions: settings.partitions,
      config,
      dataDirectory: directory
    } satisfies Running
  }).pipe(Scope.provide(scope))

// ---------------------------------------------------------------------------------------------------
// The command

export const demo = async (env: NodeJS.ProcessEnv, args: ReadonlyArray<string>): Promise<number> => {
  const options = parseDemoArgs(args)
  if ("error" in options) {
    process.stderr.write(`${options.error}\n\nUsage: quota-coordinator demo [--requests N] [--duration 3s]\n`)
    return 2
  }
  const out = (line = "") => process.stdout.write(`${line}\n`)
  const paint = color(process.stdout.isTTY === true && env["NO_COLOR"] === undefined)
  const demoStartedAt = performance.now()

  out(paint.bold("quota-coordinator demo: the seeds' races, replayed with real concurrency"))
  const ignored = ignoredVariables.filter((name) => (env[name] ?? "").trim() !== "")
  if (ignored.length > 0)
    out(paint.dim(`  (ignoring ${ignored.join(", ")}: the demo runs the built-in defaults)`))

  const scope = Effect.runSync(Scope.make())
  let scenariosHeld = 0
  let loadHeld = false
  try {
    const running = await Effect.runPromise(start(env, scope, process.stderr))
    out(`  database   embedded Postgres (PGlite) in ${running.dataDirectory}, removed at the end`)
    out(`  transport  ${running.transport}`)
    out(`  ready in ${seconds(performance.now() - demoStartedAt)}`)

    const call: Call = async (kind, command) => {
      const user = String(command["user"])
      const subject = `${running.prefix}.v1.${partitionOf(user, running.partitions)}.${kind}`
      return JSON.parse(await running.wire.request(subject, JSON.stringify(command))) as Record<
        string,
        unknown
      >
    }

    for (const [index, scenario] of scenarios.entries()) {
      const seedNumber = scenario.seed.split(" ")[0] ?? scenario.seed
      out()
      out(paint.bold(`[${index + 1}/${scenarios.length}] seed ${scenario.seed}`))
      out(`  ${scenario.title}`)
      out(`  the seed's system:`)
      for (const line of scenario.race) out(`    ${line}`)
      const user = `demo-${seedNumber.replace(/\W/g, "-")}-${randomBytes(4).toString("hex")}`
      const startedAt = performance.now()
      let outcome: { readonly lines: ReadonlyArray<string>; readonly held: boolean }
      try {
        outcome = await scenario.run(call, user)
      } catch (cause) {
        outcome = { lines: [`the scenario failed: ${reasonOf(cause)}`], held: false }
      }
      const ms = Math.round(performance.now() - startedAt)
      out(`  quota-coordinator:`)
      for (const line of outcome.lines) out(`    ${line}`)
      if (outcome.held) scenariosHeld += 1
      out(
        outcome.held
          ? paint.green(`  ✓ ${seedNumber} held: the race is closed (${ms} ms)`)
          : paint.red(`  ✗ ${seedNumber} did NOT hold: not what the protocol promises (${ms} ms)`)
      )
    }

    const limit = running.config.plans[running.config.defaultPlan]?.limits["tokens"] ?? 0
    const users = loadDefaults.messagesInFlight * loadDefaults.usersPerWorker
    out()
    out(
      paint.bold(
        `load run (${options.requests === undefined ? seconds(options.durationMs) : `about ${grouped(options.requests)} commands`}): reserve, then commit, as fast as the replies come back`
      )
    )
    out(
      `  ${grouped(users)} fresh users (${loadDefaults.messagesInFlight} of them on a tight ${grouped(loadDefaults.tightLimit)}-token limit, the rest on the plan's ${grouped(limit)}),`
    )
    out(
      `  each hold ${grouped(loadDefaults.amountMin)}-${grouped(loadDefaults.amountMax)} tokens, committed at 50-100% of it;`
    )
    out(
      `  ${loadDefaults.messagesInFlight} messages in flight, ${loadDefaults.commandsPerMessage} commands each (a batch per partition, as a client library sends them)`
    )
    const reporter = progressReporter(process.stderr)
    const report = await runLoad({
      wire: running.wire,
      prefix: running.prefix,
      partitions: running.partitions,
      limit,
      meter: "tokens",
      durationMs: options.durationMs,
      requests: options.requests,
      onProgress: reporter.update,
      onWarmedUp: (ms) =>
        out(`  users loaded from Postgres (get_usage, set_limit) in ${seconds(ms)}; clock starts`)
    })
    reporter.done()
    const rate = (report.commands * 1000) / report.elapsedMs
    const otherText = Object.entries(report.other)
      .map(([status, count]) => `${status} ${grouped(count)}`)
      .join(", ")
    out(
      `  throughput: ${grouped(rate)} commands/s (${grouped(report.commands)} commands in ${grouped(report.messages)} messages, ${(report.elapsedMs / 1000).toFixed(2)} s)`
    )
    out(
      `  latency per message: p50 ${milliseconds(percentile(report.latenciesMs, 0.5))}, p99 ${milliseconds(percentile(report.latenciesMs, 0.99))}`
    )
    out(
      `  holds: ${grouped(report.granted)} granted, ${grouped(report.committed)} committed, ${grouped(report.refused)} refused insufficient_quota${otherText === "" ? "" : `; other statuses: ${otherText}`}${report.failedMessages > 0 ? `; ${grouped(report.failedMessages)} messages failed` : ""}`
    )
    loadHeld =
      report.overGrants === 0 &&
      report.wrongfulRefusals === 0 &&
      report.ledgerMismatches === 0 &&
      report.failedMessages === 0 &&
      report.granted === report.committed
    const correctness = `correctness, from the replies alone: over-grants ${report.overGrants}, wrongful refusals ${report.wrongfulRefusals}, replies off the client's ledger ${report.ledgerMismatches}`
    out(loadHeld ? paint.green(`  ✓ ${correctness}`) : paint.red(`  ✗ ${correctness}`))
  } finally {
    const stoppingAt = performance.now()
    await Effect.runPromise(Scope.close(scope, Exit.void))
    out()
    out(
      `stopped in ${seconds(performance.now() - stoppingAt)} (transport drained, store flushed, database closed and removed); total ${seconds(performance.now() - demoStartedAt)}`
    )
  }
  const allHeld = scenariosHeld === scenarios.length && loadHeld
  out(
    allHeld
      ? paint.green(`${scenariosHeld} of ${scenarios.length} races closed; the load run's replies add up`)
      : paint.red(
          `${scenariosHeld} of ${scenarios.length} races closed${loadHeld ? "" : "; the load run's replies do NOT add up"}`
        )
  )
  return allHeld ? 0 : 1
}
