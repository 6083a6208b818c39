/**
 * What the operator's subcommands print: a readable table or sentence per result. `--json` prints the
 * result itself instead (src/cli/operator.ts).
 */
import type { HoldListResult, Result, UsageResult } from "../domain/results.js"

/** Columns padded to their widest cell, two spaces apart; numbers right-aligned. */
export const renderTable = (
  headers: ReadonlyArray<string>,
  rows: ReadonlyArray<ReadonlyArray<string | number>>
) => {
  const cells = [headers, ...rows.map((row) => row.map(String))]
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
  return `user ${JSON.stringify(user)}, plan ${usage.plan}\n\n${meters}\n\n${slotLine}${jobs}`
}

const holdsTable = (user: string, state: string, listed: HoldListResult): string => {
  if (listed.holds.length === 0)
    return `user ${JSON.stringify(user)} has no ${state === "all" ? "" : `${state} `}holds`
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
  const user = JSON.stringify(command.user)
  switch (result.status) {
    case "ok":
      if ("meters" in result) return usageTable(command.user, result)
      if ("holds" in result) return holdsTable(command.user, String(command["state"]), result)
      if (command.op === "set_plan") return `user ${user}: plan set to ${String(command["plan"])}`
      return command["limit"] === null
        ? `user ${user}: ${String(command["meter"])} limit back to the plan's default`
        : `user ${user}: ${String(command["meter"])} limit set to ${String(command["limit"])}`
    case "released":
    case "exists":
      if ("consumed" in result)
        return `user ${user}: hold ${JSON.stringify(result.id)} ${result.status === "exists" ? "was already released" : "released"} (amount ${result.amount}, consumed ${result.consumed}); ${result.meter}: used ${result.used}, reserved ${result.reserved}, available ${result.available}`
      return result.status
    case "closed":
      return "state" in result
        ? `closed: hold ${JSON.stringify(result.id)} of user ${user} is already ${result.state}, nothing to release`
        : "closed"
    case "not_found":
      return `not_found: user ${user} has no hold ${JSON.stringify(command["id"])} (closed holds are remembered 7 days)`
    case "unknown_plan":
      return `unknown_plan: the coordinator's configuration has no plan ${JSON.stringify(command["plan"])}`
    case "unknown_meter":
      return `unknown_meter: the coordinator's configuration has no meter ${JSON.stringify(command["meter"])}`
    case "invalid_request":
      return `invalid_request: ${result.error}`
    case "limit_reached":
      return `limit_reached: user ${user} is at the coordinator's ${result.bound} bound (${result.max}); commit or release holds, or end jobs, first`
    case "wrong_partition":
      return "wrong_partition: QUOTA_PARTITIONS here differs from the coordinator's (set it to the deployment's)"
    default:
      return result.status
  }
}
