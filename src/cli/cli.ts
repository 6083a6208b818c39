/**
 * The `quota-coordinator` command's subcommands: serve, migrate, demo, and the operator's (usage, holds,
 * set-plan, set-limit, release, report). Each takes `--help`. Arguments are parsed with Node's `util.parseArgs`
 * (strict: an unknown option is a usage error). Exit codes: 0 success, 1 a refusal by the coordinator
 * (operator subcommands) or a failed serve/migrate, 2 a usage, settings or connection error.
 * `runCli` returns the exit code; main.ts runs it for the process.
 */
import { parseArgs } from "node:util"
import type { ParseArgsConfig } from "node:util"
import { Cause, Deferred, Effect, Exit } from "effect"
import type { Scope } from "effect"
import { QuotaClient } from "../client/QuotaClient.js"
import { readSettings } from "../config/settings.js"
import { clientRequestTimeoutMs } from "../domain/limits.js"
import {
  exitCode,
  operatorRequest,
  reportRequest,
  runOperatorRequest,
  runReport,
  UsageError
} from "./operator.js"
import { migrateOnly, serve } from "./serve.js"

const settingsHelp = `Settings (environment):
  NATS_URL                   NATS server(s), comma-separated (default nats://127.0.0.1:4222)
  DATABASE_URL               Postgres connection string; unset: embedded PGlite under QUOTA_DATA_DIR (development only)
  QUOTA_DATA_DIR             where the embedded database lives (default .data)
  QUOTA_CONFIG               meters-and-plans JSON file (default: built-in, the seeds' numbers)
  QUOTA_PREFIX               subject prefix (default quota)
  QUOTA_PARTITIONS           partition count P (default 64; fixed once data exists)
  QUOTA_LEASE_MS             partition lease when scaled out (default 6000)
  QUOTA_HTTP_ADDR            serve's /metrics, /healthz, /readyz (default 127.0.0.1:9464; off disables)
  LOG_LEVEL                  fatal|error|warn|info|debug|trace|silent (default info)
  FAIRNESS_ENABLED           false: every acquire_slot succeeds (default true)
  FAIRNESS_FREE_LIMIT, FAIRNESS_PRO_LIMIT, FAIRNESS_PRO_PLUS_LIMIT, FAIRNESS_ENTERPRISE_LIMIT
                             slots per plan, overriding the configuration
  FAIRNESS_SNOOZE_DURATION   busy's retryAfterMs base (default 30s)
  FAIRNESS_SNOOZE_JITTER     busy's added jitter, up to (default 10s)`

const operatorNote = `Sent over NATS with the settings serve uses (NATS_URL, QUOTA_PREFIX, QUOTA_PARTITIONS).
Prints a table; --json prints the result as one line of JSON.
Exit codes: 0 success, 1 refused by the coordinator (the reason on stderr), 2 usage or connection error.`

/** Where a run reads its settings and writes its output (the process's, or a test's). */
export interface CliIo {
  readonly env: NodeJS.ProcessEnv
  /** A promise it returns is awaited by `report`: the writer's buffer is full until it settles. */
  readonly stdout: (text: string) => unknown
  readonly stderr: (text: string) => void
  /** Whether stdout and stderr are terminals (default false): `report` shows progress only on one. */
  readonly stdoutIsTerminal?: boolean
  readonly stderrIsTerminal?: boolean
}

interface Subcommand {
  readonly summary: string
  readonly help: string
  readonly options: NonNullable<ParseArgsConfig["options"]>
  readonly run: (
    positionals: ReadonlyArray<string>,
    values: Readonly<Record<string, string | boolean | undefined>>,
    io: CliIo
  ) => Promise<number>
}

const jsonOption = { json: { type: "boolean" } } as const

/** Runs an Effect program in its own scope; a failure throws its error. */
const runScoped = async <A>(effect: Effect.Effect<A, unknown, Scope.Scope>): Promise<A> => {
  const exit = await Effect.runPromiseExit(Effect.scoped(effect))
  if (Exit.isSuccess(exit)) return exit.value
  const failure = Cause.squash(exit.cause)
  // A tagged error (a store's, a setting's) carries its words in `reason`, its message empty.
  const reason = (failure as { reason?: unknown } | undefined)?.reason
  if (failure instanceof Error && failure.message !== "") throw failure
  throw new Error(typeof reason === "string" ? reason : String(failure))
}

const noPositionals = (command: string, positionals: ReadonlyArray<string>): void => {
  if (positionals.length > 0)
    throw new UsageError(`${command} takes no arguments, got ${JSON.stringify(positionals[0])}`)
}

/** The client an operator subcommand sends with: the settings serve uses, a short timeout, 3 attempts. */
const operatorClient = async (io: CliIo): Promise<() => Promise<QuotaClient>> => {
  const settings = await Effect.runPromise(readSettings(io.env)).catch((error: unknown) => {
    throw new UsageError(error instanceof Error ? error.message : String(error))
  })
  return () =>
    QuotaClient.connect({
      env: io.env,
      prefix: settings.prefix,
      partitions: settings.partitions,
      timeoutMs: clientRequestTimeoutMs,
      retry: { attemptsMax: 3 }
    })
}

/** An operator subcommand: one request over NATS, printed; its exit code says how it went. */
const operatorSubcommand = (
  name: string,
  summary: string,
  usage: string,
  options: Subcommand["options"] = {}
) =>
  ({
    summary,
    help: `Usage: quota-coordinator ${usage}\n\n${summary}.\n\n${operatorNote}`,
    options: { ...options, ...jsonOption },
    run: async (positionals, values, io) => {
      const request = operatorRequest(name, positionals, {
        state: values["state"] as string | undefined,
        limit: values["limit"] as string | undefined
      })
      const outcome = await runOperatorRequest(await operatorClient(io), request, values["json"] === true)
      await io.stdout(outcome.stdout)
      io.stderr(outcome.stderr)
      return outcome.code
    }
  }) satisfies Subcommand

const subcommands: Readonly<Record<string, Subcommand>> = {
  serve: {
    summary: "serve the partitions over NATS until SIGTERM/SIGINT, then drain and exit 0",
    help: `Usage: quota-coordinator serve

Connects to NATS_URL and DATABASE_URL (unset: embedded PGlite), migrates the schema, and answers
{QUOTA_PREFIX}.v1.{partition}.ops and .admin for its partitions (all of them on the embedded
database; a fair share of them per process on Postgres). Serves /metrics, /healthz and /readyz on
QUOTA_HTTP_ADDR. On SIGTERM or SIGINT it stops taking messages, answers those in flight, flushes the
store and exits 0.

${settingsHelp}`,
    options: {},
    run: async (positionals, _values, io) => {
      noPositionals("serve", positionals)
      const stopped = Deferred.makeUnsafe<void>()
      const stop = () => Deferred.doneUnsafe(stopped, Exit.void)
      process.once("SIGTERM", stop)
      process.once("SIGINT", stop)
      await runScoped(serve(io.env, Deferred.await(stopped)))
      return 0
    }
  },
  migrate: {
    summary: "apply the database schema and exit",
    help: `Usage: quota-coordinator migrate

Applies the numbered schema migrations to DATABASE_URL (unset: the embedded database) and records
QUOTA_PREFIX and QUOTA_PARTITIONS; refuses a database created with another partition count.

${settingsHelp}`,
    options: {},
    run: async (positionals, _values, io) => {
      noPositionals("migrate", positionals)
      const report = await runScoped(migrateOnly(io.env))
      io.stdout(
        `schema at version ${report.version}${report.applied.length > 0 ? `, applied ${report.applied.join(", ")}` : ", nothing to apply"}\n`
      )
      return 0
    }
  },
  demo: {
    summary: "replay the seeds' races against an embedded coordinator, then a short load run",
    help: `Usage: quota-coordinator demo [--requests N] [--duration 3s]

Starts the coordinator on embedded defaults (embedded Postgres in a temporary directory; NATS at
NATS_URL if one answers, else an in-process transport over the same request handler), replays each
seed's race with real concurrency next to what the seed's system did, then runs a short load.`,
    options: { requests: { type: "string" }, duration: { type: "string" } },
    run: async (positionals, values, io) => {
      noPositionals("demo", positionals)
      const { demo } = await import("./demo.js")
      const args = [
        ...(values["requests"] === undefined ? [] : ["--requests", String(values["requests"])]),
        ...(values["duration"] === undefined ? [] : ["--duration", String(values["duration"])])
      ]
      return await demo(io.env, args)
    }
  },
  usage: operatorSubcommand(
    "usage",
    "print a user's plan, usage per meter and slots (get_usage)",
    "usage USER [--json]"
  ),
  holds: operatorSubcommand(
    "holds",
    "list a user's holds, oldest first (list_holds): pending by default, closed ones still remembered, or all",
    "holds USER [--state pending|closed|all] [--limit N] [--json]",
    { state: { type: "string" }, limit: { type: "string" } }
  ),
  "set-plan": operatorSubcommand(
    "set-plan",
    "move a user to a plan (set_plan)",
    "set-plan USER PLAN [--json]"
  ),
  "set-limit": operatorSubcommand(
    "set-limit",
    "set a user's own limit of a meter, or `default` to return to the plan's (set_limit)",
    "set-limit USER METER (AMOUNT|default) [--json]"
  ),
  release: operatorSubcommand(
    "release",
    "release a user's pending hold that an operator decided to free (release, on .ops)",
    "release USER ID [--json]"
  ),
  report: {
    summary:
      "every user's usage of a meter in one period, from every partition (list_usage), as CSV or JSON lines",
    help: `Usage: quota-coordinator report METER [PERIOD] [--format csv|jsonl] [--page-size N]

Writes every user's used of METER in one period, from every partition's list_usage (partitions 0 to
QUOTA_PARTITIONS - 1, users by their UTF-8 bytes), to stdout page by page: memory holds one page of
at most --page-size users, however many there are. Only users whose used is above 0 are listed. A period's
figures are final once it has ended: run it after the period, for billing.

PERIOD, which must be one of the meter's periods:
  YYYY-MM      a month meter's month (2026-10)
  YYYY-MM-DD   a day meter's day (2026-10-31); for a month meter only its first day, YYYY-MM-01
  - or none    a none meter (a gauge such as storage): its current value

--format csv    (default) header user,meter,periodStart,used; RFC 4180: CRLF line ends, a field with a
                comma, quote, CR or LF quoted and its quotes doubled; periodStart is the UTC date
                (2026-10-01), empty for a none meter
--format jsonl  one {"user","meter","periodStart","used"} object per line; periodStart in ms since the
                epoch as events carry it (null for a none meter)
--page-size N   users per list_usage request, 1 to 1000 (default 1000): smaller replies, more requests

On a terminal, stderr shows a progress line, and users shown on stdout have their control characters
escaped; redirected, the output is exactly the coordinator's values.

Sent over NATS with the settings serve uses (NATS_URL, QUOTA_PREFIX, QUOTA_PARTITIONS).
Exit codes: 0 every partition listed, 1 refused by the coordinator (unknown_meter), 2 usage or
connection error (invalid_request: PERIOD is not one of the meter's periods). After a non-zero exit
the output is incomplete.`,
    options: { format: { type: "string" }, "page-size": { type: "string" } },
    run: async (positionals, values, io) => {
      const request = reportRequest(positionals, {
        format: values["format"] as string | undefined,
        pageSize: values["page-size"] as string | undefined
      })
      return await runReport(await operatorClient(io), request, {
        stdout: io.stdout,
        stderr: io.stderr,
        stdoutIsTerminal: io.stdoutIsTerminal === true,
        stderrIsTerminal: io.stderrIsTerminal === true
      })
    }
  }
}

const mainHelp = `quota-coordinator: holds, usage limits and fairness slots, one writer per user, durable in Postgres, over NATS.

Usage: quota-coordinator <command> [--help]

Commands:
${Object.entries(subcommands)
  .map(([name, subcommand]) => `  ${name.padEnd(11)}${subcommand.summary}`)
  .join("\n")}

${settingsHelp}`

/** Runs one command line (without the program name); resolves with its exit code. */
export const runCli = async (argv: ReadonlyArray<string>, io: CliIo): Promise<number> => {
  const [name, ...rest] = argv
  if (name === "--help" || name === "-h" || name === "help") {
    io.stdout(`${mainHelp}\n`)
    return exitCode.ok
  }
  const subcommand = name === undefined || !Object.hasOwn(subcommands, name) ? undefined : subcommands[name]
  if (name === undefined || subcommand === undefined) {
    io.stderr(`${name === undefined ? "" : `unknown command: ${name}\n\n`}${mainHelp}\n`)
    return exitCode.usage
  }
  try {
    const { values, positionals } = parseArgs({
      args: [...rest],
      options: { ...subcommand.options, help: { type: "boolean", short: "h" } },
      allowPositionals: true,
      strict: true
    })
    if (values.help === true) {
      io.stdout(`${subcommand.help}\n`)
      return exitCode.ok
    }
    return await subcommand.run(positionals, values, io)
  } catch (error) {
    const code = (error as { code?: unknown }).code
    const parseError = typeof code === "string" && code.startsWith("ERR_PARSE_ARGS")
    if (error instanceof UsageError || parseError) {
      io.stderr(`quota-coordinator ${name}: ${(error as Error).message}\n\n${subcommand.help}\n`)
      return exitCode.usage
    }
    throw error
  }
}
