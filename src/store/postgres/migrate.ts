/**
 * Applies the numbered, forward-only migrations of src/store/migrations/ to one schema.
 *
 * The numbers run from 1 without gaps, except at a number another branch has taken
 * (`migrationVersionsReserved`): each file not yet applied is applied in number order, so the reserved
 * one, once it arrives, is applied to a schema already past it too.
 *
 * Each migration runs in its own transaction that first takes a transaction-scoped advisory lock
 * keyed by the schema name, so two processes migrating at once queue up instead of racing on
 * `create schema` or applying a file twice; the second finds the work done. A schema whose latest
 * migration is newer than the newest file here is refused (`SchemaTooNew`): old code must not write
 * to a layout it does not know.
 */
import { readdir, readFile } from "node:fs/promises"
import { Effect } from "effect"
import type pg from "pg"
import type { StoreUnavailable } from "../Store.js"
import type { InvalidSchemaName } from "./errors.js"
import { MigrationFilesInvalid, SchemaTooNew, checkSchemaName, storeUnavailable } from "./errors.js"
import { withCheckedOutClient } from "./checkedOutClient.js"

/**
 * Migration numbers taken by work on another branch that this one does not have yet. A gap is allowed
 * there and nowhere else; remove a number once its file is here. None now (0010 arrived with issue 34's
 * ownership part).
 */
export const migrationVersionsReserved: ReadonlySet<number> = new Set<number>()

export interface Migration {
  /** 1, 2, 3 ...: the file's number, contiguous from 1 but for reserved numbers. */
  readonly version: number
  readonly name: string
  readonly sql: string
}

export interface MigrationReport {
  /** Versions this call applied (empty when another process or an earlier run did the work). */
  readonly applied: ReadonlyArray<number>
  /** The schema's version afterwards. */
  readonly version: number
}

export type MigrateError = StoreUnavailable | SchemaTooNew | MigrationFilesInvalid | InvalidSchemaName

/**
 * Where the .sql files are: next to this module's parent in the source tree. A build that emits to
 * dist/ must copy src/store/migrations/*.sql along (tsc does not copy them).
 */
export const migrationsDirectory = new URL("../migrations/", import.meta.url)

const migrationFilePattern = /^(\d{4})_([a-z0-9_]+)\.sql$/

/**
 * Reads and checks the migration files: numbered 0001, 0002 ... without duplicates, and without gaps
 * but at `reserved` numbers.
 */
export const readMigrations = (
  directory: URL = migrationsDirectory,
  reserved: ReadonlySet<number> = migrationVersionsReserved
): Effect.Effect<ReadonlyArray<Migration>, MigrationFilesInvalid> =>
  Effect.gen(function* () {
    const names = yield* Effect.tryPromise({
      try: () => readdir(directory),
      catch: (cause) => new MigrationFilesInvalid({ reason: `cannot list ${directory.pathname}`, cause })
    })
    const files = names
      .map((name) => ({ name, match: migrationFilePattern.exec(name) }))
      .filter((file) => file.match !== null)
      .map((file) => ({ name: file.name, version: Number(file.match![1]) }))
      .sort((left, right) => left.version - right.version)
    const migrations: Array<Migration> = []
    let expected = 1
    for (const file of files) {
      while (file.version > expected && reserved.has(expected)) expected += 1
      if (file.version !== expected) {
        return yield* new MigrationFilesInvalid({
          reason: `expected migration ${expected}, found ${file.name} in ${directory.pathname}`
        })
      }
      expected += 1
      const sql = yield* Effect.tryPromise({
        try: () => readFile(new URL(file.name, directory), "utf8"),
        catch: (cause) => new MigrationFilesInvalid({ reason: `cannot read ${file.name}`, cause })
      })
      migrations.push({ version: file.version, name: file.name, sql })
    }
    if (migrations.length === 0) {
      return yield* new MigrationFilesInvalid({ reason: `no migrations in ${directory.pathname}` })
    }
    return migrations
  })

type StepOutcome =
  | { readonly _tag: "Applied"; readonly version: number }
  | { readonly _tag: "UpToDate"; readonly version: number }
  | { readonly _tag: "TooNew"; readonly version: number }

/**
 * One transaction: lock, make sure the schema and the bookkeeping table exist, read the versions
 * applied, and apply the first migration not among them if there is one. A version applied that no
 * file here has (a newer release's, or a reserved number's that this code lacks) is refused. Returns
 * what it found; the caller loops.
 */
const migrateStep = (
  pool: pg.Pool,
  schema: string,
  migrations: ReadonlyArray<Migration>
): Promise<StepOutcome> =>
  withCheckedOutClient(pool, async (client) => {
    await client.query("begin")
    // hashtext gives an int4; the lock is per schema name, held until commit or rollback.
    await client.query("select pg_advisory_xact_lock(hashtext($1))", [`quota-coordinator.migrate.${schema}`])
    await client.query(`create schema if not exists "${schema}"`)
    await client.query(`set local search_path to "${schema}"`)
    await client.query(
      `create table if not exists "${schema}".schema_migrations (
         version integer primary key,
         name text not null,
         applied_at timestamptz not null default now()
       )`
    )
    const applied = new Set(
      (await client.query<{ version: number }>(`select version from "${schema}".schema_migrations`)).rows.map(
        (row) => row.version
      )
    )
    const version = Math.max(0, ...applied)
    const known = new Set(migrations.map((migration) => migration.version))
    const unknown = [...applied].filter((each) => !known.has(each))
    if (unknown.length > 0) {
      await client.query("rollback")
      return { _tag: "TooNew", version: Math.max(...unknown) }
    }
    const next = migrations.find((migration) => !applied.has(migration.version))
    if (next === undefined) {
      await client.query("commit")
      return { _tag: "UpToDate", version }
    }
    // The row first: were the lock ever bypassed, a second process would collide on its key.
    await client.query(`insert into "${schema}".schema_migrations (version, name) values ($1, $2)`, [
      next.version,
      next.name
    ])
    await client.query(next.sql)
    const committed = await client.query("commit")
    if (committed.command !== "COMMIT") throw new Error(`migration ${next.name} was rolled back`)
    return { _tag: "Applied", version: next.version }
  })

/** Brings `schema` up to the newest migration. Safe to run from several processes at once. */
export const migrate = (
  pool: pg.Pool,
  schema: string,
  migrations?: ReadonlyArray<Migration>
): Effect.Effect<MigrationReport, MigrateError> =>
  Effect.gen(function* () {
    const invalidName = checkSchemaName(schema)
    if (invalidName !== null) return yield* invalidName
    const known = migrations ?? (yield* readMigrations())
    const applied: Array<number> = []
    for (;;) {
      const outcome = yield* Effect.tryPromise({
        try: () => migrateStep(pool, schema, known),
        catch: storeUnavailable(`migrate schema ${schema}`)
      })
      switch (outcome._tag) {
        case "Applied":
          applied.push(outcome.version)
          continue
        case "UpToDate":
          return { applied, version: outcome.version }
        case "TooNew":
          return yield* new SchemaTooNew({
            schema,
            databaseVersion: outcome.version,
            codeVersion: known[known.length - 1]?.version ?? 0
          })
      }
    }
  })
