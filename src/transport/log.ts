/**
 * Structured logs of what the transport answers: every grant (`reserved`, `acquired`), charge, release,
 * administration change and error, with user, id or job, and meter. Reads (`get_usage`) and idempotent
 * repeats (`exists`) are debug: at tens of thousands of requests a second they would drown the rest.
 * Expiries never pass through the transport (an actor's timer decides them); the actor logs those
 * with `logExpiry` so all lines share one shape.
 */
import type { Logger, LoggerOptions } from "pino"
import { pino } from "pino"
import type { Command } from "../domain/commands.js"
import type { Result } from "../domain/results.js"
import type { LogLevel } from "../config/settings.js"

export type { Logger } from "pino"

/** A pino logger; `destination` defaults to stdout (tests pass a stream to read the lines back). */
export const makeLogger = (level: LogLevel, destination?: NodeJS.WritableStream): Logger => {
  const options: LoggerOptions = { name: "quota-coordinator", level }
  return destination === undefined ? pino(options) : pino(options, destination)
}

type Level = "debug" | "info" | "warn" | "error"

const levelOf = (command: Command, result: Result): Level => {
  switch (result.status) {
    case "reserved":
    case "consumed":
    case "committed":
    case "released":
    case "adjusted":
    case "acquired":
    case "insufficient_quota":
    case "conflict":
      return "info"
    case "ok":
      // set_plan and set_limit change what a user may do; get_usage and list_holds only read.
      return command.op === "get_usage" || command.op === "list_holds" ? "debug" : "info"
    case "invalid_request":
    case "wrong_partition":
    case "overloaded":
    case "limit_reached":
      return "warn"
    case "unavailable":
      return "error"
    default:
      return "debug"
  }
}

/** The fields that say whose, which and how much: user, id or job, meter, amount. */
const subjectFields = (command: Command): Record<string, unknown> => {
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
export const logDecision = (logger: Logger, command: Command, result: Result, ref?: string): void => {
  const level = levelOf(command, result)
  if (!logger.isLevelEnabled(level)) return
  logger[level]({ ...subjectFields(command), ...resultFields(result), ref }, `${command.op} ${result.status}`)
}

/** Logs a command refused before any decision (bad field, wrong partition). */
export const logRefusal = (logger: Logger, subject: string, result: Result, ref?: string): void => {
  const level = result.status === "invalid_request" || result.status === "wrong_partition" ? "warn" : "error"
  if (!logger.isLevelEnabled(level)) return
  logger[level]({ subject, ...resultFields(result), ref }, `command ${result.status}`)
}

/** For the actor: a hold or slot lease that ran out. */
export const logExpiry = (
  logger: Logger,
  fields: { readonly user: string; readonly id?: string; readonly job?: string; readonly meter?: string }
): void => {
  logger.info({ ...fields, status: "expired" }, fields.job === undefined ? "hold expired" : "slot expired")
}
