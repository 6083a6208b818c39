import { mkdtemp, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { pathToFileURL } from "node:url"
import { Effect } from "effect"
import { afterAll, describe, expect, it } from "vitest"
import { migrate, readMigrations } from "../../src/store/postgres/migrate.js"
import { ensureSettings } from "../../src/store/postgres/settings.js"
import { createTestSchema } from "../support/database.js"

const database = createTestSchema("migrate")
afterAll(() => database.drop())

const tablesOf = async (schema: string): Promise<Array<string>> => {
  const result = await database
    .pool()
    .query<{ table_name: string }>(
      "select table_name from information_schema.tables where table_schema = $1 order by table_name",
      [schema]
    )
  return result.rows.map((row) => row.table_name)
}

/** The versions of the numbered files shipped with the code, in order. */
const knownVersions = (await Effect.runPromise(readMigrations())).map((migration) => migration.version)
const latestVersion = knownVersions[knownVersions.length - 1]!

describe("migrate", () => {
  it("creates every table on an empty schema, and does nothing the second time", async () => {
    const pool = database.pool()
    const first = await Effect.runPromise(migrate(pool, database.schema))
    expect(first).toEqual({ applied: knownVersions, version: latestVersion })
    expect(await tablesOf(database.schema)).toEqual([
      "holds",
      "members",
      "partition_log",
      "partition_owners",
      "partition_progress",
      "period_floors",
      "schema_migrations",
      "settings",
      "slots",
      "usage_ledger",
      "usage_totals",
      "user_limits",
      "user_plans"
    ])
    const second = await Effect.runPromise(migrate(pool, database.schema))
    expect(second).toEqual({ applied: [], version: latestVersion })
  })

  it("applies each migration once when two processes migrate at the same time", async () => {
    const schema = database.freshSchema("concurrent")
    const pools = [database.pool({ max: 2 }), database.pool({ max: 2 }), database.pool({ max: 2 })]
    const reports = await Promise.all(pools.map((pool) => Effect.runPromise(migrate(pool, schema))))
    expect(reports.flatMap((report) => report.applied).sort((left, right) => left - right)).toEqual(
      knownVersions
    )
    expect(reports.map((report) => report.version)).toEqual([latestVersion, latestVersion, latestVersion])
    const rows = await pools[0]!.query(`select version from "${schema}".schema_migrations order by version`)
    expect(rows.rows).toEqual(knownVersions.map((version) => ({ version })))
  })

  it("refuses a schema migrated by a newer release, naming both versions", async () => {
    const schema = database.freshSchema("newer")
    const pool = database.pool()
    await Effect.runPromise(migrate(pool, schema))
    await pool.query(
      `insert into "${schema}".schema_migrations (version, name) values (99, '0099_future.sql')`
    )
    const error = await Effect.runPromise(Effect.flip(migrate(pool, schema)))
    expect(error._tag).toBe("SchemaTooNew")
    expect(error).toMatchObject({ schema, databaseVersion: 99, codeVersion: latestVersion })
    expect(error.message).toContain("migration 99")
  })

  it("refuses a schema name that is not a plain identifier", async () => {
    const error = await Effect.runPromise(Effect.flip(migrate(database.pool(), 'quota"; drop table x; --')))
    expect(error._tag).toBe("InvalidSchemaName")
  })

  it("refuses migration files with a gap in their numbers", async () => {
    const directory = await mkdtemp(join(tmpdir(), "migrations-"))
    await writeFile(join(directory, "0001_a.sql"), "select 1")
    await writeFile(join(directory, "0003_c.sql"), "select 1")
    const error = await Effect.runPromise(Effect.flip(readMigrations(pathToFileURL(`${directory}/`))))
    expect(error._tag).toBe("MigrationFilesInvalid")
    expect(error.reason).toContain("expected migration 2")
  })

  it("takes a gap only at a reserved number, and applies that number's file once it arrives", async () => {
    const directory = await mkdtemp(join(tmpdir(), "migrations-"))
    const url = pathToFileURL(`${directory}/`)
    const reserved = new Set([2])
    await writeFile(join(directory, "0001_a.sql"), "create table a (x int)")
    await writeFile(join(directory, "0003_c.sql"), "create table c (x int)")
    const withGap = await Effect.runPromise(readMigrations(url, reserved))
    // Elsewhere a gap is still refused.
    const refused = await Effect.runPromise(Effect.flip(readMigrations(url, new Set())))
    expect(refused._tag).toBe("MigrationFilesInvalid")
    const schema = database.freshSchema("reserved")
    const pool = database.pool()
    expect(await Effect.runPromise(migrate(pool, schema, withGap))).toEqual({ applied: [1, 3], version: 3 })
    // The reserved file arrives (a merge): applied to the schema already past it.
    await writeFile(join(directory, "0002_b.sql"), "create table b (x int)")
    const complete = await Effect.runPromise(readMigrations(url, reserved))
    expect(await Effect.runPromise(migrate(pool, schema, complete))).toEqual({ applied: [2], version: 3 })
    expect(await tablesOf(schema)).toEqual(["a", "b", "c", "schema_migrations"])
    // Code without the reserved file must not write to a schema that has it.
    const error = await Effect.runPromise(Effect.flip(migrate(pool, schema, withGap)))
    expect(error).toMatchObject({ _tag: "SchemaTooNew", databaseVersion: 2, codeVersion: 3 })
  })

  it("stops the upgrade to the partition log while the outbox holds unpublished events", async () => {
    const schema = database.freshSchema("outbox_upgrade")
    const pool = database.pool()
    const migrations = await Effect.runPromise(readMigrations())
    const beforeLog = migrations.filter((migration) => migration.version < 12)
    await Effect.runPromise(migrate(pool, schema, beforeLog))
    await pool.query(
      `insert into "${schema}".events_outbox (partition, user_id, kind, at, body) values
         (3, 'alice', 'limit_changed', 1, '{}'), (3, 'alice', 'limit_changed', 2, '{}')`
    )
    const refused = await Effect.runPromise(Effect.flip(migrate(pool, schema, migrations)))
    expect(refused._tag).toBe("StoreUnavailable")
    expect(refused).toMatchObject({
      reason: expect.stringContaining("events_outbox holds 2 events not yet published")
    })
    expect(await tablesOf(schema)).toContain("events_outbox")
    // Published by the previous version (its rows deleted): the upgrade goes through.
    await pool.query(`delete from "${schema}".events_outbox`)
    expect(await Effect.runPromise(migrate(pool, schema, migrations))).toMatchObject({ applied: [12] })
    expect(await tablesOf(schema)).not.toContain("events_outbox")
  })

  it("rolls a failing migration back entirely", async () => {
    const schema = database.freshSchema("failing")
    const pool = database.pool()
    const migrations = [
      { version: 1, name: "0001_ok.sql", sql: "create table a (x int)" },
      { version: 2, name: "0002_bad.sql", sql: "create table b (x int); select 1 / 0" }
    ]
    const error = await Effect.runPromise(Effect.flip(migrate(pool, schema, migrations)))
    expect(error._tag).toBe("StoreUnavailable")
    expect(await tablesOf(schema)).toEqual(["a", "schema_migrations"])
    const versions = await pool.query(`select version from "${schema}".schema_migrations`)
    expect(versions.rows).toEqual([{ version: 1 }])
  })
})

describe("ensureSettings", () => {
  it("records the settings once and refuses another partition count or prefix", async () => {
    const schema = database.freshSchema("settings")
    const pool = database.pool()
    await Effect.runPromise(migrate(pool, schema))
    const recorded = await Effect.runPromise(
      ensureSettings(pool, schema, { prefix: "quota", partitions: 64 })
    )
    expect(recorded).toMatchObject({ prefix: "quota", partitions: 64 })
    expect(recorded.createdAt).toBeGreaterThan(0)
    const again = await Effect.runPromise(ensureSettings(pool, schema, { prefix: "quota", partitions: 64 }))
    // The row that stands: the first start's, creation time included.
    expect(again).toEqual(recorded)

    const partitions = await Effect.runPromise(
      Effect.flip(ensureSettings(pool, schema, { prefix: "quota", partitions: 32 }))
    )
    expect(partitions).toMatchObject({
      _tag: "SettingsMismatch",
      setting: "partitions",
      stored: 64,
      configured: 32
    })
    expect(partitions.message).toContain("partitions")

    const prefix = await Effect.runPromise(
      Effect.flip(ensureSettings(pool, schema, { prefix: "other", partitions: 64 }))
    )
    expect(prefix).toMatchObject({ _tag: "SettingsMismatch", setting: "prefix", stored: "quota" })
  })

  it("agrees on one row when several coordinators start at once on a fresh database", async () => {
    const schema = database.freshSchema("settings_race")
    const pools = [database.pool(), database.pool(), database.pool()]
    await Effect.runPromise(migrate(pools[0]!, schema))
    const results = await Promise.all(
      pools.map((pool, index) =>
        Effect.runPromise(
          Effect.result(ensureSettings(pool, schema, { prefix: "quota", partitions: 8 + index }))
        )
      )
    )
    const succeeded = results.filter((result) => result._tag === "Success")
    expect(succeeded).toHaveLength(1)
    const rows = await pools[0]!.query(`select partitions from "${schema}".settings`)
    expect(rows.rows).toHaveLength(1)
  })
})
