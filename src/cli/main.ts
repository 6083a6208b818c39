#!/usr/bin/env node
/**
 * The `quota-coordinator` command: serve, migrate, demo, usage. Each takes `--help`.
 */
import { Deferred, Effect, Exit, Cause } from "effect"
import { usage } from "./usage.js"
import { migrateOnly, serve } from "./serve.js"

const settingsHelp = `Settings (environment):
  NATS_URL                   NATS server(s), comma-separated (default nats://127.0.0.1:4222)
  DATABASE_URL               Postgres connection string; unset: embedded PGlite under QUOTA_DATA_DIR (development only)
  QUOTA_DATA_DIR             where the embedded database lives (default .data)
  QUOTA_CONFIG               meters-and-plans JSON file (default: built-in, the seeds' numbers)
  QUOTA_PREFIX               subject prefix (default quota)
  QUOTA_PARTITIONS           partition count P (default 64; fixed once data exists)
  LOG_LEVEL                  fatal|error|warn|info|debug|trace|silent (default info)
  FAIRNESS_ENABLED           false: every acquire_slot succeeds (default true)
  FAIRNESS_FREE_LIMIT, FAIRNESS_PRO_LIMIT, FAIRNESS_PRO_PLUS_LIMIT, FAIRNESS_ENTERPRISE_LIMIT
                             slots per plan, overriding the configuration
  FAIRNESS_SNOOZE_DURATION   busy's retryAfterMs base (default 30s)
  FAIRNESS_SNOOZE_JITTER     busy's added jitter, up to (default 10s)`

const help: Record<string, string> = {
  main: `quota-coordinator: holds, usage limits and fairness slots, one writer per user, durable in Postgres, over NATS.

Usage: quota-coordinator <command> [--help]

Commands:
  serve          serve every partition over NATS until SIGTERM/SIGINT, then drain and exit 0
  migrate        apply the database schema and exit
  demo           replay the seeds' races against an embedded coordinator, then a short load run
  usage <user>   print a user's usage (get_usage over NATS)

${settingsHelp}`,
  serve: `Usage: quota-coordinator serve

Connects to NATS_URL and DATABASE_URL (unset: embedded PGlite), migrates the schema, and answers
{QUOTA_PREFIX}.v1.{partition}.ops and .admin for every partition. On SIGTERM or SIGINT it stops
taking messages, answers those in flight, flushes the store and exits 0.

${settingsHelp}`,
  migrate: `Usage: quota-coordinator migrate

Applies the numbered schema migrations to DATABASE_URL (unset: the embedded database) and records
QUOTA_PREFIX and QUOTA_PARTITIONS; refuses a database created with another partition count.

${settingsHelp}`,
  demo: `Usage: quota-coordinator demo [--requests N] [--duration 3s]

Starts the coordinator on embedded defaults (embedded Postgres in a temporary directory; NATS at
NATS_URL if one answers, else an in-process transport over the same request handler), replays each
seed's race with real concurrency next to what the seed's system did, then runs a short load.`,
  usage: `Usage: quota-coordinator usage <user>

Sends get_usage for <user> to {QUOTA_PREFIX}.v1.{partition}.admin over NATS_URL and prints the result.`
}

const runScoped = async <A>(effect: Effect.Effect<A, unknown, import("effect").Scope.Scope>): Promise<A> => {
  const exit = await Effect.runPromiseExit(Effect.scoped(effect))
  if (Exit.isSuccess(exit)) return exit.value
  const failure = Cause.squash(exit.cause)
  throw failure instanceof Error ? failure : new Error(String(failure))
}

const main = async (argv: ReadonlyArray<string>): Promise<number> => {
  const [command, ...rest] = argv
  if (command === undefined || command === "--help" || command === "-h" || command === "help") {
    process.stdout.write(`${help["main"]}\n`)
    return command === undefined ? 1 : 0
  }
  if (rest.includes("--help") || rest.includes("-h")) {
    const text = Object.hasOwn(help, command) ? help[command] : undefined
    if (text === undefined) {
      process.stderr.write(`unknown command: ${command}\n\n${help["main"]}\n`)
      return 2
    }
    process.stdout.write(`${text}\n`)
    return 0
  }
  switch (command) {
    case "serve": {
      const stopped = Deferred.makeUnsafe<void>()
      const stop = () => Deferred.doneUnsafe(stopped, Exit.void)
      process.once("SIGTERM", stop)
      process.once("SIGINT", stop)
      await runScoped(serve(process.env, Deferred.await(stopped)))
      return 0
    }
    case "migrate": {
      const report = await runScoped(migrateOnly(process.env))
      process.stdout.write(
        `schema at version ${report.version}${report.applied.length > 0 ? `, applied ${report.applied.join(", ")}` : ", nothing to apply"}\n`
      )
      return 0
    }
    case "usage": {
      const user = rest[0]
      if (user === undefined) {
        process.stderr.write(`${help["usage"]}\n`)
        return 2
      }
      process.stdout.write(`${JSON.stringify(await usage(process.env, user), null, 2)}\n`)
      return 0
    }
    case "demo": {
      const { demo } = await import("./demo.js")
      return await demo(process.env, rest)
    }
    default:
      process.stderr.write(`unknown command: ${command}\n\n${help["main"]}\n`)
      return 2
  }
}

main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (error: unknown) => {
    process.stderr.write(`quota-coordinator: ${error instanceof Error ? error.message : String(error)}\n`)
    process.exit(1)
  }
)
