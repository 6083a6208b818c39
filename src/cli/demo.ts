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
import { parseArgs } from "node:util"
import { randomBytes } from "node:crypto"
import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Context, Effect, Exit, Layer, Scope } from "effect"
import { parseDurationMs } from "../config/settings.js"
import { natsConnectionVariables, redactUrls } from "../config/natsConnection.js"
import type { Config } from "../domain/config.js"
import { planLimit, planNamed } from "../domain/config.js"
import { partitionOf } from "../domain/partition.js"
import { embeddedPostgres } from "../store/embedded.js"
import type { Logger } from "../transport/log.js"
import { makeLogger } from "../transport/log.js"
import { LocalTransport, localTransportLayer } from "../transport/LocalTransport.js"
import { reasonOf } from "../transport/errors.js"
import type { Call } from "./demoScenarios.js"
import { scenarios } from "./demoScenarios.js"
import type { DatabaseTarget } from "./serve.js"
import { coordinatorLayerFor, loadSettingsAndConfig, serveLayers, storeLayerFor } from "./serve.js"
import type { Wire } from "./demoOutput.js"
import {
  color,
  grouped,
  seconds,
  milliseconds,
  percentile,
  natsWire,
  localWire,
  probeNats
} from "./demoOutput.js"
import { loadDefaults, runLoad, progressReporter } from "./demoLoad.js"

// ---------------------------------------------------------------------------------------------------
// Arguments

export interface DemoOptions {
  /** Stop the load run after about this many commands (reserves and commits); else run for durationMs. */
  readonly requests: number | undefined
  readonly durationMs: number
}

const defaultDurationMs = 3_000

export const parseDemoArgs = (args: ReadonlyArray<string>): DemoOptions | { readonly error: string } => {
  let values: { requests?: string | undefined; duration?: string | undefined }
  try {
    values = parseArgs({
      args: [...args],
      options: { requests: { type: "string" }, duration: { type: "string" } },
      strict: true,
      allowPositionals: false
    }).values
  } catch (error) {
    return { error: error instanceof Error ? error.message : String(error) }
  }
  let requests: number | undefined
  if (values.requests !== undefined) {
    const count = /^\d+$/.test(values.requests) ? Number(values.requests) : NaN
    if (!Number.isSafeInteger(count) || count < 1)
      return { error: `--requests: expected a positive integer, got ${values.requests}` }
    requests = count
  }
  let durationMs = defaultDurationMs
  if (values.duration !== undefined) {
    const ms = parseDurationMs(values.duration)
    if (ms === undefined || ms < 100 || ms > 600_000)
      return { error: `--duration: expected a duration from 100ms to 10m such as 3s, got ${values.duration}` }
    durationMs = ms
  }
  return { requests, durationMs }
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
    // NATS as configured (URL, credentials, TLS); everything else is the demo's own.
    const natsEnvironment = Object.fromEntries(
      Object.values(natsConnectionVariables).flatMap((variable) =>
        env[variable] === undefined ? [] : [[variable, env[variable]]]
      )
    )
    const prefix = `quota-demo-${randomBytes(4).toString("hex")}`
    const directory = yield* Effect.acquireRelease(
      Effect.promise(() => mkdtemp(join(tmpdir(), "quota-demo-"))),
      (path) => Effect.promise(() => rm(path, { recursive: true, force: true }))
    )
    const { settings, config } = yield* loadSettingsAndConfig({
      ...natsEnvironment,
      LOG_LEVEL: env["LOG_LEVEL"]?.trim() || "warn",
      QUOTA_PREFIX: prefix,
      QUOTA_DATA_DIR: directory
    })
    const logger: Logger = makeLogger(settings.logLevel, logStream)
    // The NATS probe (up to a second) runs while the embedded database starts.
    const [probe, database] = yield* Effect.all(
      [
        Effect.acquireRelease(
          Effect.promise(() => probeNats(settings.nats, 1_000)),
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
      transport = `NATS at ${redactUrls(settings.nats.servers.join(","))}, subjects ${prefix}.v1.{0..${settings.partitions - 1}}.ops`
    } else {
      const store = storeLayerFor(settings, config, target)
      const coordinator = coordinatorLayerFor(config, logger, settings.partitions, undefined).pipe(
        Layer.provide(store)
      )
      const layer = localTransportLayer({ prefix, partitions: settings.partitions, logger }).pipe(
        Layer.provide(coordinator)
      )
      const context = yield* Layer.build(layer)
      wire = localWire(Context.get(context, LocalTransport))
      transport = `in-process (no NATS at ${redactUrls(settings.nats.servers.join(","))}: ${probe.reason}); same request handler as the NATS service`
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

    const plan = planNamed(running.config, running.config.defaultPlan)
    const limit = plan === undefined ? 0 : planLimit(plan, "tokens")
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
