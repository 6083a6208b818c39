/**
 * Never serve from a standby: a store whose address reaches a server in recovery, or one set
 * read-only, refuses its connections (loads and writes answer `unavailable`) and the readiness ping
 * says why; once the address reaches a writable primary it serves again by itself. The standby is a
 * real streaming standby of a Postgres 15 primary of this file's own (test/nemesis/standby.ts).
 */
import { randomUUID } from "node:crypto"
import { Writable } from "node:stream"
import { Effect, Exit } from "effect"
import pg from "pg"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { watchReplication } from "../../src/cli/watchReplication.js"
import { makePrometheusMetrics } from "../../src/ops/PrometheusMetrics.js"
import { makeReadiness } from "../../src/ops/Readiness.js"
import { makeLogger } from "../../src/transport/log.js"
import type { PostgresStore } from "../../src/store/postgres/PostgresStore.js"
import { makePostgresStore, poolConfig, scopedPool } from "../../src/store/postgres/PostgresStore.js"
import { migrate } from "../../src/store/postgres/migrate.js"
import { notWritableReasons } from "../../src/store/postgres/writablePrimary.js"
import { sleep } from "../cluster/cluster.js"
import { acquireScoped, testDatabaseUrl } from "../support/database.js"
import type { StandbyPair } from "../nemesis/standby.js"
import { startTcpProxy } from "../support/tcpProxy.js"
import { standbyAvailable, startStandbyPair } from "../nemesis/standby.js"
import { loadUser } from "../support/loadUser.js"

const portOf = (url: string): number => Number(new URL(url).port)

const withPort = (url: string, port: number): string => {
  const next = new URL(url)
  next.port = String(port)
  return next.toString()
}

/** A store on its own pool (as serve makes it), without migrating: the schema is made on the primary. */
const storeAt = (connectionString: string, schema: string) =>
  acquireScoped(
    Effect.gen(function* () {
      const pool = yield* scopedPool(poolConfig(connectionString, 2, true))
      return yield* makePostgresStore({ pool, schema, partitions: 16, pipelined: true })
    })
  )

const loads = async (store: PostgresStore): Promise<Exit.Exit<unknown, unknown>> =>
  Effect.runPromiseExit(loadUser(store, "u1", Date.now()))

/** Runs the readiness ping until its report of Postgres is `reason` (undefined: up), or fails after 10 s. */
const readinessSays = async (
  store: PostgresStore,
  reason: string | undefined
): Promise<string | undefined> => {
  const readiness = makeReadiness()
  const watch = await acquireScoped(readiness.watchPostgres(store.ping, { intervalMs: 50, timeoutMs: 2_000 }))
  try {
    const until = Date.now() + 10_000
    for (;;) {
      const said = readiness.report().reasons.postgres
      if (said === reason || Date.now() > until) return said
      await sleep(25)
    }
  } finally {
    await watch.close()
  }
}

const schema = "standby_test"

const standbyHasSchema = async (standbyUrl: string): Promise<boolean> => {
  const standby = new pg.Client({ connectionString: standbyUrl })
  try {
    await standby.connect()
    const found = await standby.query<{ t: string | null }>("select to_regclass($1) as t", [
      `${schema}.settings`
    ])
    return found.rows[0]?.t !== null && found.rows[0]?.t !== undefined
  } catch {
    // Not there yet: the database's creation is not applied on the standby.
    return false
  } finally {
    await standby.end().catch(() => undefined)
  }
}

/** What watchReplication says on `pool` (its log lines, level and msg) and the gauge as scraped. */
const replicationSaid = async (pool: pg.Pool) => {
  const lines: Array<{ level: number; msg: string }> = []
  const sink = new Writable({
    write(chunk: Buffer, _encoding, done) {
      for (const line of chunk
        .toString()
        .split("\n")
        .filter((each) => each !== ""))
        lines.push(JSON.parse(line) as { level: number; msg: string })
      done()
    }
  })
  const watched = await acquireScoped(watchReplication(pool, makeLogger("info", sink)))
  try {
    const metrics = makePrometheusMetrics({ meters: [], plans: [], processMetrics: false })
    metrics.setGaugeSources({ postgresSynchronousStandbys: watched.value })
    const scraped = (await metrics.scrape()).body
    const gauge = /^quota_postgres_synchronous_standbys (\d+)$/m.exec(scraped)?.[1]
    return { lines, gauge: gauge === undefined ? undefined : Number(gauge) }
  } finally {
    await watched.close()
  }
}

describe.skipIf(!standbyAvailable())("never serving from a standby (a real streaming standby)", () => {
  let pair: StandbyPair

  beforeAll(async () => {
    pair = await startStandbyPair()
    await Effect.runPromise(migrate(pair.database.pool, schema))
    // The database and schema reach the standby (it applies WAL a little after the primary commits).
    const until = Date.now() + 30_000
    while (!(await standbyHasSchema(pair.standbyUrl))) {
      if (Date.now() > until) throw new Error("the schema never reached the standby")
      await sleep(50)
    }
  }, 120_000)

  afterAll(async () => {
    await pair?.database.drop()
    await pair?.stop()
  }, 60_000)

  it("refuses a standby, says why, and serves again once the address reaches the primary", async () => {
    const proxy = await startTcpProxy("127.0.0.1", portOf(pair.standbyUrl))
    const store = await storeAt(withPort(pair.database.url, proxy.port), schema)
    try {
      const onStandby = await loads(store.value)
      const saidOnStandby = await readinessSays(store.value, notWritableReasons.inRecovery)
      console.log(`on the standby: load ${onStandby._tag}, /readyz postgres: ${String(saidOnStandby)}`)
      expect(Exit.isFailure(onStandby)).toBe(true)
      expect(String(Exit.isFailure(onStandby) ? onStandby.cause : "")).toContain(
        notWritableReasons.inRecovery
      )
      expect(saidOnStandby).toBe(notWritableReasons.inRecovery)

      proxy.retarget(portOf(pair.database.url))
      const saidOnPrimary = await readinessSays(store.value, undefined)
      const onPrimary = await loads(store.value)
      console.log(`on the primary: load ${onPrimary._tag}, /readyz postgres: ${String(saidOnPrimary)}`)
      expect(saidOnPrimary).toBeUndefined()
      expect(Exit.isSuccess(onPrimary)).toBe(true)
    } finally {
      await store.close()
      await proxy.close()
    }
  }, 60_000)

  it("logs the primary's synchronous standby at start and counts it in quota_postgres_synchronous_standbys", async () => {
    // As serve's sessions commit: synchronous_commit as the server says (on).
    const pool = new pg.Pool({ connectionString: pair.database.url, max: 2 })
    const said = await replicationSaid(pool).finally(() => pool.end())
    console.log(`with a synchronous standby: gauge ${said.gauge}, log ${JSON.stringify(said.lines)}`)
    expect(said.gauge).toBe(1)
    expect(said.lines).toHaveLength(1)
    expect(said.lines[0]!.level).toBe(30)
    expect(said.lines[0]!.msg).toContain("nemesis-standby (sync)")
    expect(said.lines[0]!.msg).toContain("an acknowledged grant survives the primary's loss")
    // Sessions committing with synchronous_commit = local (the pair's own pool) wait for no standby.
    const local = await replicationSaid(pair.database.pool)
    expect(local.lines[0]!.level).toBe(40)
    expect(local.lines[0]!.msg).toContain("synchronous_commit local")
  })
})

if (!standbyAvailable())
  describe("never serving from a standby", () => {
    it.skip("needs the Postgres 15 server binaries (/usr/lib/postgresql/15/bin): the standby test is skipped", () => {})
  })

describe("saying what the deployment risks (shared Postgres, no standby)", () => {
  it("warns at start that an acknowledged grant may be lost, and the gauge reads 0", async () => {
    const pool = new pg.Pool({ connectionString: testDatabaseUrl, max: 2 })
    try {
      const said = await replicationSaid(pool)
      console.log(`without a standby: gauge ${said.gauge}, log ${JSON.stringify(said.lines)}`)
      expect(said.gauge).toBe(0)
      expect(said.lines).toHaveLength(1)
      expect(said.lines[0]!.level).toBe(40)
      expect(said.lines[0]!.msg).toContain("an acknowledged grant may be lost if the primary is lost")
    } finally {
      await pool.end()
    }
  })
})

describe("never serving from a read-only server (shared Postgres)", () => {
  const database = `qc_readonly_${randomUUID().replaceAll("-", "").slice(0, 12)}`
  const admin = new pg.Client({ connectionString: testDatabaseUrl })
  const url = new URL(testDatabaseUrl)
  url.pathname = `/${database}`

  beforeAll(async () => {
    await admin.connect()
    await admin.query(`create database "${database}"`)
    const pool = new pg.Pool({ connectionString: url.toString(), max: 1 })
    await Effect.runPromise(migrate(pool, schema))
    await pool.end()
  })

  afterAll(async () => {
    await admin.query(`drop database if exists "${database}" with (force)`)
    await admin.end()
  })

  it("refuses a database set read-only, says why, and serves again when it is writable", async () => {
    await admin.query(`alter database "${database}" set default_transaction_read_only = on`)
    const store = await storeAt(url.toString(), schema)
    try {
      const readOnly = await loads(store.value)
      const saidReadOnly = await readinessSays(store.value, notWritableReasons.readOnly)
      console.log(`read-only: load ${readOnly._tag}, /readyz postgres: ${String(saidReadOnly)}`)
      expect(Exit.isFailure(readOnly)).toBe(true)
      expect(saidReadOnly).toBe(notWritableReasons.readOnly)

      await admin.query(`alter database "${database}" reset default_transaction_read_only`)
      const saidWritable = await readinessSays(store.value, undefined)
      const writable = await loads(store.value)
      console.log(`writable: load ${writable._tag}, /readyz postgres: ${String(saidWritable)}`)
      expect(saidWritable).toBeUndefined()
      expect(Exit.isSuccess(writable)).toBe(true)
    } finally {
      await store.close()
    }
  }, 30_000)
})
