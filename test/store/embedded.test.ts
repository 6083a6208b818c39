/**
 * The zero-setup path: PGlite served on a local port, driven by the same migrate, settings and
 * PostgresStore code as a real server, through a one-connection pool.
 */
import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Effect } from "effect"
import pg from "pg"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import type { StoreEvent } from "../../src/domain/events.js"
import type { EmbeddedPostgres } from "../../src/store/embedded.js"
import { startEmbeddedPostgres } from "../../src/store/embedded.js"
import { makePostgresStore } from "../../src/store/postgres/PostgresStore.js"
import { migrate, readMigrations } from "../../src/store/postgres/migrate.js"
import { ensureSettings } from "../../src/store/postgres/settings.js"
import { acquireScoped } from "../support/database.js"
import { loadUser } from "../support/loadUser.js"

const now = Date.UTC(2026, 10, 15, 12)
const month = Date.UTC(2026, 10, 1)

const eventsOf = (user: string): Array<StoreEvent> => [
  {
    kind: "hold",
    user,
    hold: {
      id: "h",
      meter: "analysis",
      amount: 10,
      consumed: 2,
      state: "pending",
      expiresAt: now + 60_000,
      createdAt: now,
      closedAt: null
    }
  },
  {
    kind: "ledger",
    user,
    meter: "analysis",
    periodStart: month,
    operation: "consume",
    holdId: "h",
    key: "k",
    requested: 2,
    delta: 2,
    at: now
  },
  { kind: "usage", user, meter: "analysis", periodStart: month, used: 2 },
  { kind: "slot", user, job: "job", leaseExpiresAt: now + 60_000 }
]

let dataDirectory: string
let embedded: EmbeddedPostgres

beforeAll(async () => {
  dataDirectory = await mkdtemp(join(tmpdir(), "pglite-"))
  embedded = await Effect.runPromise(startEmbeddedPostgres({ dataDirectory: join(dataDirectory, "db") }))
})
afterAll(async () => {
  await embedded.close()
  await rm(dataDirectory, { recursive: true, force: true })
})

/** The versions of the numbered files shipped with the code, in order. */
const knownVersions = (await Effect.runPromise(readMigrations())).map((migration) => migration.version)
const latestVersion = knownVersions[knownVersions.length - 1]!

describe("embedded Postgres (PGlite)", () => {
  it("serves a connection string on 127.0.0.1 with a one-connection pool", () => {
    expect(embedded.connectionString).toMatch(/^postgres:\/\/postgres@127\.0\.0\.1:\d+\/postgres$/)
    expect(embedded.poolMax).toBe(1)
  })

  it("migrates, checks settings, writes through group commit and loads, then survives a restart", async () => {
    const pool = new pg.Pool({ connectionString: embedded.connectionString, max: embedded.poolMax })
    pool.on("error", () => {})
    expect(await Effect.runPromise(migrate(pool, "quota"))).toEqual({
      applied: knownVersions,
      version: latestVersion
    })
    expect(await Effect.runPromise(migrate(pool, "quota"))).toEqual({ applied: [], version: latestVersion })
    await Effect.runPromise(ensureSettings(pool, "quota", { prefix: "quota", partitions: 64 }))
    const opened = await acquireScoped(makePostgresStore({ pool, schema: "quota", partitions: 64 }))
    const store = opened.value
    // Concurrent writers and loads: with one connection they must queue, not deadlock.
    const writes = Array.from({ length: 50 }, (_, index) => store.write(eventsOf(`embedded-${index}`)))
    const loads = Array.from({ length: 5 }, (_, index) => loadUser(store, `embedded-${index}`, now))
    await Effect.runPromise(Effect.all([...writes, ...loads], { concurrency: "unbounded", discard: true }))
    const loaded = await Effect.runPromise(loadUser(store, "embedded-7", now))
    expect(loaded.holds.map((hold) => [hold.id, hold.consumed, hold.consumeKeys])).toEqual([["h", 2, ["k"]]])
    expect(loaded.usage).toEqual([{ meter: "analysis", periodStart: month, used: 2, thresholdsCrossed: [] }])
    expect(loaded.slots).toEqual([{ job: "job", leaseExpiresAt: now + 60_000 }])
    expect((await Effect.runPromise(store.commitStats)).commits).toBeLessThan(50)
    expect(await Effect.runPromise(store.reconcile())).toEqual([])
    expect(await Effect.runPromise(store.usersWithExpiries(now + 60_000, 100))).toHaveLength(50)
    await opened.close()
    await pool.end()

    // Reopen the same data directory: the rows are on disk.
    await embedded.close()
    embedded = await Effect.runPromise(startEmbeddedPostgres({ dataDirectory: join(dataDirectory, "db") }))
    const reopened = new pg.Pool({ connectionString: embedded.connectionString, max: embedded.poolMax })
    reopened.on("error", () => {})
    expect(await Effect.runPromise(migrate(reopened, "quota"))).toEqual({
      applied: [],
      version: latestVersion
    })
    const refused = await Effect.runPromise(
      Effect.flip(ensureSettings(reopened, "quota", { prefix: "quota", partitions: 32 }))
    )
    expect(refused._tag).toBe("SettingsMismatch")
    const result = await reopened.query(`select count(*)::integer as holds from quota.holds`)
    expect(result.rows).toEqual([{ holds: 50 }])
    await reopened.end()
  })
})
