/**
 * The deployment settings stored with the data. The first coordinator to start records its prefix and
 * partition count; every later one must match, because holds and slots carry a `partition` computed
 * with that count and clients hash users to subjects with it.
 */
import { Effect } from "effect"
import type pg from "pg"
import type { StoreUnavailable } from "../Store.js"
import type { InvalidSchemaName } from "./errors.js"
import { SettingsMismatch, checkSchemaName, storeUnavailable } from "./errors.js"

export interface DeploymentSettings {
  readonly prefix: string
  readonly partitions: number
}

/** The settings as stored: with when this database was first started (it names this database's events). */
export interface StoredSettings extends DeploymentSettings {
  readonly createdAt: number
}

/**
 * Inserts the row if absent and returns the row that stands, in one statement: a concurrent first
 * start of two coordinators collides on the singleton key and the loser reads the winner's row.
 */
const ensureSettingsSql = (schema: string): string => `
  with inserted as (
    insert into "${schema}".settings (prefix, partitions, created_at)
    values ($1, $2, $3)
    on conflict (singleton) do nothing
    returning prefix, partitions, created_at
  )
  select prefix, partitions, created_at::text from inserted
  union all
  select prefix, partitions, created_at::text from "${schema}".settings where not exists (select from inserted)
`

/** Records the settings on a fresh database, or checks them against the stored ones. */
export const ensureSettings = (
  pool: pg.Pool,
  schema: string,
  configured: DeploymentSettings,
  now: number = Date.now()
): Effect.Effect<StoredSettings, SettingsMismatch | StoreUnavailable | InvalidSchemaName> =>
  Effect.gen(function* () {
    const invalidName = checkSchemaName(schema)
    if (invalidName !== null) return yield* invalidName
    const runOnce = Effect.tryPromise({
      try: () =>
        pool.query<{ prefix: string; partitions: number; created_at: string }>(ensureSettingsSql(schema), [
          configured.prefix,
          configured.partitions,
          now
        ]),
      catch: storeUnavailable("ensure settings")
    })
    // Empty only when another process inserted the row after this statement's snapshot was taken
    // (its insert waited on the other's and did nothing): the second run sees the committed row.
    let stored = (yield* runOnce).rows[0]
    if (stored === undefined) stored = (yield* runOnce).rows[0]
    if (stored === undefined) {
      return yield* storeUnavailable("ensure settings")(new Error("settings row not found after insert"))
    }
    if (stored.partitions !== configured.partitions) {
      return yield* new SettingsMismatch({
        setting: "partitions",
        stored: stored.partitions,
        configured: configured.partitions
      })
    }
    if (stored.prefix !== configured.prefix) {
      return yield* new SettingsMismatch({
        setting: "prefix",
        stored: stored.prefix,
        configured: configured.prefix
      })
    }
    return { prefix: stored.prefix, partitions: stored.partitions, createdAt: Number(stored.created_at) }
  })
