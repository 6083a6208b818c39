/**
 * Failures of the Postgres store, one tagged class each. Errors thrown by `pg` are mapped here, once,
 * at the edge: callers see `StoreUnavailable` (retry later) or a configuration error (fix and restart).
 */
import { Data } from "effect"
import { StoreUnavailable } from "../Store.js"

/** The configured schema name is not a plain lower-case identifier (it is spliced into SQL). */
export class InvalidSchemaName extends Data.TaggedError("InvalidSchemaName")<{
  readonly schema: string
}> {
  override get message(): string {
    return `schema name ${JSON.stringify(this.schema)} must match ^[a-z_][a-z0-9_]{0,62}$`
  }
}

/** The database was migrated by a newer release: running older code on it could corrupt it. */
export class SchemaTooNew extends Data.TaggedError("SchemaTooNew")<{
  readonly schema: string
  readonly databaseVersion: number
  readonly codeVersion: number
}> {
  override get message(): string {
    return `schema ${this.schema} is at migration ${this.databaseVersion}, this release knows up to ${this.codeVersion}: upgrade the coordinator`
  }
}

/** The migration files shipped with the code are unreadable or misnumbered (a packaging bug). */
export class MigrationFilesInvalid extends Data.TaggedError("MigrationFilesInvalid")<{
  readonly reason: string
  readonly cause?: unknown
}> {}

/** The database was created for another prefix or partition count; every stored partition would be wrong. */
export class SettingsMismatch extends Data.TaggedError("SettingsMismatch")<{
  readonly setting: "partitions" | "prefix"
  readonly stored: string | number
  readonly configured: string | number
}> {
  override get message(): string {
    return `the database was created with ${this.setting} ${JSON.stringify(this.stored)}, the coordinator is configured with ${JSON.stringify(this.configured)}; ${this.setting} never change while data exists`
  }
}

/** `pg` errors carry a SQLSTATE in `code`; keep it in the reason so logs say what Postgres said. */
const describePgError = (cause: unknown): string => {
  if (cause instanceof Error) {
    const code = (cause as { code?: unknown }).code
    return typeof code === "string" ? `${cause.message} (SQLSTATE ${code})` : cause.message
  }
  return String(cause)
}

/** The one mapping of a `pg` failure: `operation` says what the store was doing. */
export const storeUnavailable =
  (operation: string) =>
  (cause: unknown): StoreUnavailable =>
    new StoreUnavailable({ reason: `${operation}: ${describePgError(cause)}`, cause })

const schemaNamePattern = /^[a-z_][a-z0-9_]{0,62}$/

/** The schema name, checked so that splicing it into SQL (quoted) is safe. */
export const checkSchemaName = (schema: string): InvalidSchemaName | null =>
  schemaNamePattern.test(schema) ? null : new InvalidSchemaName({ schema })

/**
 * Socket errors and Postgres's own refusals that mean no server answers at the address now: refused
 * or reset (the server died, a failover moved the address), unresolvable, or a server shutting down or
 * starting (SQLSTATE 57P01-57P03).
 */
const connectionFailureCodes: ReadonlySet<string> = new Set([
  "ECONNREFUSED",
  "ECONNRESET",
  "EPIPE",
  "ETIMEDOUT",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "ENOTFOUND",
  "EAI_AGAIN",
  "57P01",
  "57P02",
  "57P03"
])

/** `pg`'s words when a connection ends under it or its connect times out (it sets no code then). */
const connectionFailureMessages = [/^Connection terminated/, /^timeout expired/, /connection timeout/i]

/** How many causes deep connectionFailedIn looks (a StoreUnavailable over `pg`'s error is two). */
const causeDepthMax = 4

/**
 * Whether `cause` (or what it wraps, as a StoreUnavailable wraps `pg`'s error) says the server could
 * not be reached, rather than that it answered with an error: /readyz says which.
 */
export const connectionFailedIn = (cause: unknown): boolean => {
  for (
    let current = cause, depth = 0;
    depth < causeDepthMax && typeof current === "object" && current !== null;
    depth += 1
  ) {
    const { code, message } = current as { code?: unknown; message?: unknown }
    if (typeof code === "string" && connectionFailureCodes.has(code)) return true
    if (typeof message === "string" && connectionFailureMessages.some((pattern) => pattern.test(message)))
      return true
    current = (current as { cause?: unknown }).cause
  }
  return false
}
