/**
 * What the operator's subcommands print: a readable table or sentence per result. `--json` prints the
 * result itself instead (src/cli/operator.ts).
 *
 * Users, hold ids and jobs are chosen by whichever service sent them, so they may hold escape
 * sequences meant for the operator's terminal (clear the screen, set the title, rewrite a line,
 * reorder text with bidi overrides). Every value printed is passed through `terminalSafe` first.
 */
import type { HoldListResult, Result, UsageResult } from "../domain/results.js"

/**
 * What a terminal may act on instead of showing: C0 controls (ESC, BEL, CR, LF, ...), DEL, C1
 * controls (U+009B is a one-character CSI), the bidi marks, embeddings, overrides and isolates, and
 * the line and paragraph separators.
 */
// eslint-disable-next-line no-control-regex -- control characters are exactly what it is about
const terminalControl = /[\u0000-\u001f\u007f-\u009f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]/g

/** `\u001b` for ESC and so on: the JSON spelling, so a value shown can be typed back into --json's. */
const escapeControl = (char: string): string => `\\u${char.charCodeAt(0).toString(16).padStart(4, "0")}`

/**
 * `text` with every character a terminal would act on written as its `\uXXXX` escape. With
 * `keepNewlines`, LF stays (the rows of a table); a value's own LF was escaped when its cell was.
 */
export const terminalSafe = (text: string, keepNewlines = false): string =>
  text.replace(terminalControl, (char) => (keepNewlines && char === "\n" ? char : escapeControl(char)))

/**
 * `--json`'s line with the controls JSON.stringify leaves as they are (DEL, C1, bidi) escaped too:
 * the same JSON value, so a program reads exactly what the coordinator sent, and a terminal shows it inert.
 */
export const jsonTerminalSafe = (json: string): string => json.replace(terminalControl, escapeControl)

/** A value in a sentence: quoted as JSON, then made inert. */
const quoted = (value: unknown): string => terminalSafe(JSON.stringify(value) ?? String(value))

/** Columns padded to their widest cell, two spaces apart; numbers right-aligned. */
export const renderTable = (
  headers: ReadonlyArray<string>,
  rows: ReadonlyArray<ReadonlyArray<string | number>>
) => {
  const cells = [headers, ...rows.map((row) => row.map((cell) => terminalSafe(String(cell))))]
  const numeric = headers.map(
    (_, column) => rows.length > 0 && rows.every((row) => typeof row[column] === "number")
  )
  const widths = headers.map((_, column) => Math.max(...cells.map((row) => row[column]!.length)))
  return cells
    .map((row) =>
      row
        .map((cell, column) =>
          numeric[column] ? cell.padStart(widths[column]!) : cell.padEnd(widths[column]!)
        )
        .join("  ")
        .trimEnd()
    )
    .join("\n")
}

const isoTime = (ms: number): string => new Date(ms).toISOString()

const usageTable = (user: string, usage: UsageResult): string => {
  const meters = renderTable(
    ["meter", "period", "period start", "used", "reserved", "limit", "available", "overage", "pending holds"],
    usage.meters.map((meter) => [
      meter.meter,
      meter.period,
      meter.periodStart === null ? "-" : isoTime(meter.periodStart).slice(0, 10),
      meter.used,
      meter.reserved,
      meter.limit,
      meter.available,
      meter.overage,
      meter.pendingHolds
    ])
  )
  const { slots } = usage
  const slotLine = `slots: ${slots.held} held of ${slots.limit ?? "unlimited (fairness off)"}, ${slots.waiting} waiting`
  const jobs =
    slots.jobs.length === 0
      ? ""
      : `\n${renderTable(
          ["job", "lease expires at"],
          slots.jobs.map((job) => [job.job, isoTime(job.leaseExpiresAt)])
        )}`
  return `user ${quoted(user)}, plan ${terminalSafe(usage.plan)}\n\n${meters}\n\n${slotLine}${jobs}`
}

const holdsTable = (user: string, state: string, listed: HoldListResult): string => {
  if (listed.holds.length === 0)
    return `user ${quoted(user)} has no ${state === "all" ? "" : `${state} `}holds`
  const table = renderTable(
    ["id", "meter", "amount", "consumed", "state", "created at", "expires at"],
    listed.holds.map((hold) => [
      hold.id,
      hold.meter,
      hold.amount,
      hold.consumed,
      hold.state,
      isoTime(hold.createdAt),
      isoTime(hold.expiresAt)
    ])
  )
  return listed.more
    ? `${table}\n\n${listed.holds.length} shown, oldest first; more exist (raise --limit, up to 1000)`
    : table
}

/** One line or table for the result of `command`, success or refusal. */
export const describeResult = (
  command: Readonly<Record<string, unknown>> & { readonly op: string; readonly user: string },
  result: Result
): string => {
  const user = quoted(command.user)
  switch (result.status) {
    case "ok":
      if ("meters" in result) return usageTable(command.user, result)
      if ("holds" in result) return holdsTable(command.user, String(command["state"]), result)
      if (command.op === "set_plan")
        return `user ${user}: plan set to ${terminalSafe(String(command["plan"]))}`
      return command["limit"] === null
        ? `user ${user}: ${terminalSafe(String(command["meter"]))} limit back to the plan's default`
        : `user ${user}: ${terminalSafe(String(command["meter"]))} limit set to ${String(command["limit"])}`
    case "released":
    case "exists":
      if ("consumed" in result)
        return `user ${user}: hold ${quoted(result.id)} ${result.status === "exists" ? "was already released" : "released"} (amount ${result.amount}, consumed ${result.consumed}); ${terminalSafe(result.meter)}: used ${result.used}, reserved ${result.reserved}, available ${result.available}`
      return result.status
    case "closed":
      return "state" in result
        ? `closed: hold ${quoted(result.id)} of user ${user} is already ${result.state}, nothing to release`
        : "closed"
    case "not_found":
      return `not_found: user ${user} has no hold ${quoted(command["id"])} (closed holds are remembered 7 days)`
    case "unknown_plan":
      return `unknown_plan: the coordinator's configuration has no plan ${quoted(command["plan"])}`
    case "unknown_meter":
      return `unknown_meter: the coordinator's configuration has no meter ${quoted(command["meter"])}`
    case "invalid_request":
      return `invalid_request: ${terminalSafe(result.error)}`
    case "limit_reached":
      return `limit_reached: user ${user} is at the coordinator's ${terminalSafe(String(result.bound))} bound (${result.max}); commit or release holds, or end jobs, first`
    case "wrong_partition":
      return "wrong_partition: QUOTA_PARTITIONS here differs from the coordinator's (set it to the deployment's)"
    default:
      return result.status
  }
}

/** `report`'s output formats: CSV (RFC 4180) or one JSON object per line. */
export type ReportFormat = "csv" | "jsonl"

export const reportCsvHeader = "user,meter,periodStart,used\r\n"

/**
 * One CSV field as RFC 4180 writes it: quoted, its quotes doubled, when it holds a quote, a comma,
 * CR or LF; as it is otherwise. Values are never altered otherwise: a billing file carries the users
 * the coordinator knows, byte for byte.
 */
export const csvField = (value: string): string =>
  /[",\r\n]/.test(value) ? `"${value.replaceAll('"', '""')}"` : value

/** The period start as the CSV shows it: its UTC date (`2026-10-01`), empty for a `none` meter. */
const csvPeriod = (periodStart: number | null): string =>
  periodStart === null ? "" : isoTime(periodStart).slice(0, 10)

/**
 * The lines of one page of `report`, ready to write at once. CSV lines end in CRLF (RFC 4180); with
 * `toTerminal` each user is made inert first (`terminalSafe`), since a terminal, not a file, reads it.
 * JSON lines carry `periodStart` as the wire and `usage_recorded` do (ms, or null), so a program can
 * match them against events; their controls are escaped as JSON (`jsonTerminalSafe`), the same value.
 */
export const reportLines = (
  format: ReportFormat,
  meter: string,
  periodStart: number | null,
  usage: ReadonlyArray<{ readonly user: string; readonly used: number }>,
  toTerminal: boolean
): string => {
  if (format === "jsonl")
    return usage
      .map(
        (row) =>
          `${jsonTerminalSafe(JSON.stringify({ user: row.user, meter, periodStart, used: row.used }))}\n`
      )
      .join("")
  const tail = `,${csvField(meter)},${csvPeriod(periodStart)},`
  return usage
    .map((row) => `${csvField(toTerminal ? terminalSafe(row.user) : row.user)}${tail}${row.used}\r\n`)
    .join("")
}
