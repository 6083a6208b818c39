/**
 * Structured logs of what the transport answers. One line per decision is `debug`: at tens of thousands
 * of requests a second, lines at `info` for every grant, charge and refusal were gigabytes an hour for
 * whoever ships the logs, and cost a third of the throughput (issue 21); the events stream is the
 * durable record of what changed, and the metrics count every decision by status. At the default
 * `info` a process logs its lifecycle, ownership, outages, errors and administration changes
 * (`set_plan`, `set_limit`: rare, made by operators, worth a line each). Expiries never pass through
 * the transport (an actor's timer decides them); the actor logs those with `logExpiry`, also at debug.
 */
import type { Logger, LoggerOptions } from "pino"
import { pino } from "pino"
import type { Command, ListUsageCommand } from "../domain/commands.js"
import type { Result } from "../domain/results.js"
import type { LogLevel } from "../config/settings.js"

export type { Logger } from "pino"

/** A pino logger; `destination` defaults to stdout (tests pass a stream to read the lines back). */
export const makeLogger = (level: LogLevel, destination?: NodeJS.WritableStream): Logger => {
  const options: LoggerOptions = { name: "quota-coordinator", level }
  return destination === undefined ? pino(options) : pino(options, destination)
}

type Level = "debug" | "info"

const levelOf = (command: Command | ListUsageCommand, result: Result): Level =>
  result.status === "ok" && (command.op === "set_plan" || command.op === "set_limit") ? "info" : "debug"

/** The fields that say whose, which and how much: user, id or job, meter, amount. */
const subjectFields = (command: Command | ListUsageCommand): Record<string, unknown> => {
  if (command.op === "list_usage") {
    const { op, partition, meter, periodStart, after, limit } = command
    return { op, partition, meter, periodStart, after, limit }
  }
  const { op, user } = command
  switch (command.op) {
    case "reserve":
    case "adjust":
      return { op, user, id: command.id, meter: command.meter, amount: command.amount }
    case "consume":
      return { op, user, id: command.id, amount: command.amount, key: command.key }
    case "commit":
      return { op, user, id: command.id, amount: command.amount }
    case "release":
    case "extend":
      return { op, user, id: command.id }
    case "acquire_slot":
    case "renew_slot":
    case "release_slot":
      return { op, user, job: command.job }
    case "set_plan":
      return { op, user, plan: command.plan }
    case "set_limit":
      return { op, user, meter: command.meter, limit: command.limit }
    case "list_holds":
      return { op, user, state: command.state, limit: command.limit }
    case "usage_history":
      return { op, user, meter: command.meter, periods: command.periods }
    case "get_usage":
    case "tick":
      return { op, user }
  }
}

/** What the result adds: the hold's meter (commit and release name only the id), the state after. */
const resultFields = (result: Result): Record<string, unknown> => {
  const fields: Record<string, unknown> = { status: result.status }
  if ("meter" in result) fields["meter"] = result.meter
  if ("used" in result) {
    fields["used"] = result.used
    fields["reserved"] = result.reserved
    fields["limit"] = result.limit
  }
  if ("consumed" in result) fields["consumed"] = result.consumed
  if ("state" in result) fields["state"] = result.state
  if ("leaseExpiresAt" in result) fields["leaseExpiresAt"] = result.leaseExpiresAt
  if ("error" in result) fields["error"] = result.error
  if ("bound" in result) {
    fields["bound"] = result.bound
    fields["max"] = result.max
  }
  return fields
}

/** Logs one decided command at the level its result deserves. */
export const logDecision = (
  logger: Logger,
  command: Command | ListUsageCommand,
  result: Result,
  ref?: string
): void => {
  const level = levelOf(command, result)
  if (!logger.isLevelEnabled(level)) return
  logger[level]({ ...subjectFields(command), ...resultFields(result), ref }, `${command.op} ${result.status}`)
}

/** Logs a command refused before any decision (bad field, wrong partition). */
export const logRefusal = (logger: Logger, subject: string, result: Result, ref?: string): void => {
  // A caller's mistake, one line per request: counted by the metrics, detailed at debug.
  if (!logger.isLevelEnabled("debug")) return
  logger.debug({ subject, ...resultFields(result), ref }, `command ${result.status}`)
}

/** For the actor: a hold or slot lease that ran out. */
export const logExpiry = (
  logger: Logger,
  fields: { readonly user: string; readonly id?: string; readonly job?: string; readonly meter?: string }
): void => {
  if (!logger.isLevelEnabled("debug")) return
  logger.debug({ ...fields, status: "expired" }, fields.job === undefined ? "hold expired" : "slot expired")
}
