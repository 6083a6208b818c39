/**
 * The operator's subcommands: `usage`, `holds`, `set-plan`, `set-limit`, `release`. Each sends one
 * command over NATS with the settings `serve` uses (QUOTA_PREFIX, QUOTA_PARTITIONS and the NATS
 * connection), prints a readable table (or with `--json` the result as one line of JSON) and exits
 * 0 on success, 1 when the coordinator refused (`unknown_plan`, `not_found`, ...) and 2 on a usage
 * error or when the coordinator could not be reached. `report` walks every partition's `list_usage`
 * (revision 1.3) and streams CSV or JSON lines, with the same exit codes.
 */
import { UsageListRefused } from "../client/errors.js"
import type { QuotaClient } from "../client/QuotaClient.js"
import { meterNamePattern } from "../domain/config.js"
import { amountMax, holdListLimitMax, usageListLimitMax } from "../domain/limits.js"
import type { Result } from "../domain/results.js"
import type { ReportFormat } from "./operatorOutput.js"
import {
  describeResult,
  jsonTerminalSafe,
  reportCsvHeader,
  reportLines,
  terminalSafe
} from "./operatorOutput.js"

/** Exit codes of the operator's subcommands. */
export const exitCode = { ok: 0, refused: 1, usage: 2 } as const

export class UsageError extends Error {
  override readonly name = "UsageError"
}

/** A subcommand's command, checked: what it sends and which statuses count as success. */
export interface OperatorRequest {
  readonly kind: "ops" | "admin"
  readonly command: Readonly<Record<string, unknown>> & { readonly op: string; readonly user: string }
  /** Statuses answered with exit 0; every other status the protocol allows is a refusal (1). */
  readonly success: ReadonlyArray<string>
}

const holdStates = ["pending", "closed", "all"] as const

const parseLimit = (
  text: string | undefined,
  option = "--limit",
  limitMax = holdListLimitMax
): number | undefined => {
  if (text === undefined) return undefined
  const limit = /^\d+$/.test(text) ? Number(text) : NaN
  if (!Number.isSafeInteger(limit) || limit < 1 || limit > limitMax)
    throw new UsageError(`${option} must be an integer from 1 to ${limitMax}, got ${JSON.stringify(text)}`)
  return limit
}

const parseAmount = (text: string): number | null => {
  if (text === "default") return null
  const amount = /^\d+$/.test(text) ? Number(text) : NaN
  if (!Number.isSafeInteger(amount) || amount > amountMax)
    throw new UsageError(
      `AMOUNT must be an integer from 0 to 2^53-1, or default, got ${JSON.stringify(text)}`
    )
  return amount
}

const positionals = (args: ReadonlyArray<string>, names: ReadonlyArray<string>): ReadonlyArray<string> => {
  if (args.length !== names.length)
    throw new UsageError(
      args.length < names.length
        ? `missing ${names.slice(args.length).join(" ")}`
        : `unexpected argument ${JSON.stringify(args[names.length])}`
    )
  for (const [index, value] of args.entries())
    if (value === "") throw new UsageError(`${names[index]} must not be empty`)
  return args
}

/** Builds the request of a subcommand from its positionals and options; throws UsageError. */
export const operatorRequest = (
  subcommand: string,
  args: ReadonlyArray<string>,
  options: { readonly state?: string | undefined; readonly limit?: string | undefined }
): OperatorRequest => {
  switch (subcommand) {
    case "usage": {
      const [user] = positionals(args, ["USER"])
      return { kind: "admin", command: { op: "get_usage", user: user! }, success: ["ok"] }
    }
    case "holds": {
      const [user] = positionals(args, ["USER"])
      const state = options.state ?? "pending"
      if (!(holdStates as ReadonlyArray<string>).includes(state))
        throw new UsageError(`--state must be pending, closed or all, got ${JSON.stringify(state)}`)
      const limit = parseLimit(options.limit)
      return {
        kind: "admin",
        command: { op: "list_holds", user: user!, state, ...(limit === undefined ? {} : { limit }) },
        success: ["ok"]
      }
    }
    case "set-plan": {
      const [user, plan] = positionals(args, ["USER", "PLAN"])
      return { kind: "admin", command: { op: "set_plan", user: user!, plan: plan! }, success: ["ok"] }
    }
    case "set-limit": {
      const [user, meter, amount] = positionals(args, ["USER", "METER", "AMOUNT"])
      return {
        kind: "admin",
        command: { op: "set_limit", user: user!, meter: meter!, limit: parseAmount(amount!) },
        success: ["ok"]
      }
    }
    case "release": {
      const [user, id] = positionals(args, ["USER", "ID"])
      // `exists`: it was already released, which is what the operator asked for.
      return {
        kind: "ops",
        command: { op: "release", user: user!, id: id! },
        success: ["released", "exists"]
      }
    }
    default:
      throw new UsageError(`unknown command ${JSON.stringify(subcommand)}`)
  }
}

/** Statuses that say the call itself was wrong (fix the arguments or the settings): exit 2. */
const usageStatuses: ReadonlySet<string> = new Set(["invalid_request", "wrong_partition"])

export interface OperatorOutcome {
  readonly code: number
  readonly stdout: string
  readonly stderr: string
}

/** The outcome of a result: what to print, and the exit code. */
export const outcomeOf = (request: OperatorRequest, result: Result, json: boolean): OperatorOutcome => {
  const succeeded = request.success.includes(result.status)
  const code = succeeded ? exitCode.ok : usageStatuses.has(result.status) ? exitCode.usage : exitCode.refused
  // describeResult escapes each value it prints; this pass only guards against one it missed.
  const described = terminalSafe(describeResult(request.command, result), true)
  if (json)
    return {
      code,
      stdout: `${jsonTerminalSafe(JSON.stringify(result))}\n`,
      stderr: succeeded ? "" : `${described}\n`
    }
  return succeeded
    ? { code, stdout: `${described}\n`, stderr: "" }
    : { code, stdout: "", stderr: `${described}\n` }
}

/** A failure to reach the coordinator (connection, no responders, timeouts, retries exhausted). */
const unreachable = (error: unknown): OperatorOutcome => ({
  code: exitCode.usage,
  stdout: "",
  stderr: `quota-coordinator: ${terminalSafe(error instanceof Error ? error.message : String(error), true)}\n`
})

/** Connects, sends the request, and closes. Never throws: every failure is an outcome. */
export const runOperatorRequest = async (
  connect: () => Promise<QuotaClient>,
  request: OperatorRequest,
  json: boolean
): Promise<OperatorOutcome> => {
  let client: QuotaClient
  try {
    client = await connect()
  } catch (error) {
    return unreachable(error)
  }
  try {
    return outcomeOf(request, await send(client, request), json)
  } catch (error) {
    return unreachable(error)
  } finally {
    await client.close().catch(() => undefined)
  }
}

/** The client call of the request's op (the command was checked by operatorRequest). */
const send = (client: QuotaClient, request: OperatorRequest): Promise<Result> => {
  const command = request.command as never
  switch (request.command.op) {
    case "get_usage":
      return client.getUsage(command)
    case "list_holds":
      return client.listHolds(command)
    case "set_plan":
      return client.setPlan(command)
    case "set_limit":
      return client.setLimit(command)
    case "release":
      return client.release(command)
    default:
      return Promise.reject(new Error(`bug: no client call for ${request.command.op}`))
  }
}

/** `report METER [PERIOD] [--format csv|jsonl]`, checked. */
export interface ReportRequest {
  readonly meter: string
  /** The period's start (ms, UTC); null for a `none` meter (PERIOD `-` or omitted). */
  readonly periodStart: number | null
  readonly format: ReportFormat
  /** Users per `list_usage` page (1 to 1 000); undefined: the coordinator's default, 1 000. */
  readonly pageSize: number | undefined
}

const reportFormats: ReadonlyArray<ReportFormat> = ["csv", "jsonl"]

/**
 * PERIOD as `report` takes it: `YYYY-MM` is the month's start (a `month` meter), `YYYY-MM-DD` the
 * day's (a `day` meter), `-` or nothing no period (a `none` meter). Which form fits is the meter's to
 * say: the coordinator answers `invalid_request` to a start that is not one of the meter's periods.
 */
export const parsePeriod = (text: string | undefined): number | null => {
  if (text === undefined || text === "-") return null
  const match = /^(\d{4})-(\d{2})(?:-(\d{2}))?$/.exec(text)
  const [year, month, day] = [Number(match?.[1]), Number(match?.[2]), Number(match?.[3] ?? "1")]
  const start = Date.UTC(year, month - 1, day)
  const date = new Date(start)
  // Date.UTC rolls 2026-02-30 over into March: a date that does not read back is not a date.
  if (
    match === null ||
    year < 1970 ||
    date.getUTCFullYear() !== year ||
    date.getUTCMonth() !== month - 1 ||
    date.getUTCDate() !== day
  )
    throw new UsageError(
      `PERIOD must be YYYY-MM (a month meter), YYYY-MM-DD (a day meter) or - (a none meter), got ${JSON.stringify(text)}`
    )
  return start
}

/** Builds `report`'s request from its positionals and options; throws UsageError. */
export const reportRequest = (
  args: ReadonlyArray<string>,
  options: { readonly format?: string | undefined; readonly pageSize?: string | undefined }
): ReportRequest => {
  if (args.length === 0) throw new UsageError("missing METER")
  if (args.length > 2) throw new UsageError(`unexpected argument ${JSON.stringify(args[2])}`)
  const [meter, period] = args as [string, string | undefined]
  if (!meterNamePattern.test(meter))
    throw new UsageError(`METER must match ${meterNamePattern.source}, got ${JSON.stringify(meter)}`)
  const format = options.format ?? "csv"
  if (!(reportFormats as ReadonlyArray<string>).includes(format))
    throw new UsageError(`--format must be csv or jsonl, got ${JSON.stringify(format)}`)
  return {
    meter,
    periodStart: parsePeriod(period),
    format: format as ReportFormat,
    pageSize: parseLimit(options.pageSize, "--page-size", usageListLimitMax)
  }
}

/** Where `report` writes: rows to `stdout` (awaited, so a slow reader holds the walk back), the rest to `stderr`. */
export interface ReportIo {
  readonly stdout: (text: string) => unknown
  readonly stderr: (text: string) => void
  /** stdout is a terminal: users are made inert before they are shown. */
  readonly stdoutIsTerminal: boolean
  /** stderr is a terminal: a progress line is kept up to date there. */
  readonly stderrIsTerminal: boolean
}

/** Erases the progress line (carriage return, erase to the end of the line). */
const clearLine = "\r\u001b[K"

/**
 * Connects, walks every partition's `list_usage` and writes each page as it comes: memory holds one
 * page, whatever the deployment holds. Resolves with the exit code: 0 every partition listed, 1 the
 * coordinator refused (`unknown_meter`), 2 a usage error (`invalid_request`: a PERIOD that is not one
 * of the meter's periods) or a connection failure. Output before a non-zero exit is incomplete.
 */
export const runReport = async (
  connect: () => Promise<QuotaClient>,
  request: ReportRequest,
  io: ReportIo
): Promise<number> => {
  let client: QuotaClient
  try {
    client = await connect()
  } catch (error) {
    io.stderr(unreachable(error).stderr)
    return exitCode.usage
  }
  let users = 0
  const progress = (partition: number) => {
    if (io.stderrIsTerminal)
      io.stderr(`${clearLine}report: partition ${partition + 1} of ${client.partitions}, ${users} users`)
  }
  try {
    // The header goes with the first answer: a refused report (unknown_meter) writes nothing to stdout.
    let header = request.format === "csv" ? reportCsvHeader : ""
    const pages = client.usagePages({
      meter: request.meter,
      ...(request.periodStart === null ? {} : { periodStart: request.periodStart }),
      ...(request.pageSize === undefined ? {} : { limit: request.pageSize })
    })
    for await (const page of pages) {
      if (page.usage.length > 0 || header !== "")
        await io.stdout(
          header +
            reportLines(request.format, request.meter, request.periodStart, page.usage, io.stdoutIsTerminal)
        )
      header = ""
      users += page.usage.length
      progress(page.partition)
    }
    if (io.stderrIsTerminal)
      io.stderr(`${clearLine}report: ${client.partitions} partitions, ${users} users\n`)
    return exitCode.ok
  } catch (error) {
    if (io.stderrIsTerminal) io.stderr(clearLine)
    if (!(error instanceof UsageListRefused)) {
      io.stderr(unreachable(error).stderr)
      return exitCode.usage
    }
    const command = { op: "list_usage", user: "", meter: request.meter }
    io.stderr(`${terminalSafe(describeResult(command, error.result))} (partition ${error.partition})\n`)
    return usageStatuses.has(error.result.status) ? exitCode.usage : exitCode.refused
  } finally {
    await client.close().catch(() => undefined)
  }
}
