/**
 * Thousands of invalid messages against the coordinator on this machine's NATS and Postgres: every one
 * gets a clear error (a 400 service error, or `invalid_request` naming the field, or
 * `wrong_partition`), the process keeps answering, and the rows in Postgres are exactly what they were
 * before: invalid input changes nothing.
 */
import { connect } from "@nats-io/transport-node"
import type { NatsConnection } from "@nats-io/transport-node"
import { Effect, Exit, Layer, Scope } from "effect"
import fc from "fast-check"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { coordinatorLayer } from "../../src/actors/Coordinator.js"
import { defaultConfig } from "../../src/domain/config.js"
import { partitionOf } from "../../src/domain/partition.js"
import { postgresStoreLayer } from "../../src/store/postgres/PostgresStore.js"
import { makeLogger } from "../../src/transport/log.js"
import { natsServerLayer } from "../../src/transport/NatsServer.js"
import { createTestSchema } from "../support/database.js"
import { randomPrefix } from "../support/processes.js"
import { checkpointAll } from "../../src/store/postgres/partitionLog.js"

const database = createTestSchema("fuzz_pg")
const prefix = randomPrefix("fuzzpg")
const partitions = 8
const user = "fuzz-pg-user"
let scope: Scope.Closeable
let nc: NatsConnection
const counts = { messages: 0, refused400: 0, invalidRequest: 0, wrongPartition: 0 }

beforeAll(async () => {
  const layer = natsServerLayer({
    servers: "nats://127.0.0.1:4222",
    prefix,
    partitions,
    logger: makeLogger("silent")
  }).pipe(
    Layer.provide(
      coordinatorLayer({ config: defaultConfig, partitions }).pipe(
        Layer.provide(
          postgresStoreLayer({
            connectionString: database.connectionString,
            schema: database.schema,
            prefix,
            partitions
          })
        )
      )
    )
  )
  scope = Effect.runSync(Scope.make())
  await Effect.runPromise(Layer.buildWithScope(layer, scope))
  nc = await connect({ servers: "127.0.0.1:4222" })
})

afterAll(async () => {
  console.log(`fuzz over Postgres: ${JSON.stringify(counts)}`)
  await nc?.close()
  await Effect.runPromise(Scope.close(scope, Exit.void))
  await database.drop()
})

const subject = (kind: "ops" | "admin" = "ops") => `${prefix}.v1.${partitionOf(user, partitions)}.${kind}`

/** Every row of every table, as text: equal before and after means nothing changed. */
const fingerprint = async (): Promise<string> => {
  const pool = database.pool({ max: 1 })
  // The tables are the log's checkpoint: brought up to date before they are read.
  await checkpointAll(pool, database.schema)
  const parts: Array<string> = []
  for (const table of ["holds", "usage_ledger", "usage_totals", "slots", "user_plans", "user_limits"]) {
    const rows = await pool.query(`select * from "${database.schema}".${table} order by 1, 2`)
    parts.push(`${table}:${JSON.stringify(rows.rows)}`)
  }
  return parts.join("\n")
}

const send = async (body: string | Uint8Array, kind: "ops" | "admin" = "ops") => {
  counts.messages += 1
  const reply = await nc.request(subject(kind), body, { timeout: 10_000 })
  if (reply.headers?.get("Nats-Service-Error-Code") === "400") {
    counts.refused400 += 1
    expect(reply.data.length).toBe(0)
    expect(reply.headers.get("Nats-Service-Error")).toMatch(/\S/)
    return []
  }
  const parsed = reply.json<unknown>()
  const results = (Array.isArray(parsed) ? parsed : [parsed]) as Array<{ status: string; error?: string }>
  for (const result of results) {
    if (result.status === "invalid_request") {
      counts.invalidRequest += 1
      // "<field>: <what is wrong>"
      expect(result.error).toMatch(/^[A-Za-z_][A-Za-z0-9_.[\]]*: \S/)
    } else {
      counts.wrongPartition += 1
      expect(result.status).toBe("wrong_partition")
    }
  }
  return results
}

/** A valid command of each operation, to break one field of. */
const templates: ReadonlyArray<Record<string, unknown>> = [
  { op: "reserve", user, meter: "analysis", amount: 1, id: "h1", ttlMs: 60_000 },
  { op: "consume", user, id: "h1", amount: 1, key: "k1" },
  { op: "commit", user, id: "h1", amount: 1 },
  { op: "release", user, id: "h1" },
  { op: "extend", user, id: "h1", ttlMs: 60_000 },
  { op: "adjust", user, meter: "analysis", amount: 5, id: "a1" },
  { op: "acquire_slot", user, job: "j1", leaseMs: 60_000, waitMs: 0 },
  { op: "renew_slot", user, job: "j1", leaseMs: 60_000 },
  { op: "release_slot", user, job: "j1" }
]

const badAmount = fc.oneof(
  fc.integer({ max: -1 }),
  fc.double({ noNaN: true, noDefaultInfinity: true }).filter((value) => !Number.isInteger(value)),
  fc.constantFrom(2 ** 53, 2 ** 60, 1e300, "NaN", "Infinity", "10", true, null, [], {})
)
const badIdentifier = fc.oneof(
  fc.constantFrom("", 42, true, null, [], {}, "\ud800", "x".repeat(257), "😀".repeat(65)),
  fc.string({ minLength: 257, maxLength: 300 }),
  fc
    .string({ unit: "grapheme", minLength: 90, maxLength: 120 })
    .filter((text) => Buffer.byteLength(text) > 256)
)
// Not null: an optional field that is null counts as absent, which is valid.
const badDuration = fc.oneof(
  fc.integer({ max: 999 }),
  fc.integer({ min: 86_400_001 }),
  fc.constantFrom(1.5, "60s")
)
const badMeter = fc.constantFrom("Analysis", "9tokens", "a".repeat(64), "", "has space", 7, null)
const knownOps = [
  "reserve",
  "consume",
  "commit",
  "release",
  "extend",
  "adjust",
  "acquire_slot",
  "renew_slot",
  "release_slot",
  "get_usage",
  "set_plan",
  "set_limit"
]
const badOp = fc.oneof(
  fc.string().filter((op) => !knownOps.includes(op)),
  fc.constantFrom(1, null, "tick", "RESERVE")
)

const mutated = fc.tuple(fc.constantFrom(...templates), fc.nat()).chain(([template, pick]) => {
  const fields = Object.keys(template)
  const field = fields[pick % fields.length]!
  const bad =
    field === "amount"
      ? template["op"] === "adjust"
        ? fc.oneof(
            fc.constantFrom(2 ** 53, -(2 ** 53), 0.5, "5", null),
            fc.double({ noNaN: true, noDefaultInfinity: true }).filter((v) => !Number.isInteger(v))
          )
        : template["op"] === "commit"
          ? badAmount.filter((value) => value !== null)
          : badAmount
      : field === "ttlMs" || field === "leaseMs"
        ? badDuration
        : field === "waitMs"
          ? fc.constantFrom(-1, 300_001, 0.5, "0")
          : field === "meter"
            ? badMeter
            : field === "op"
              ? badOp
              : field === "user"
                ? badIdentifier.filter((value) => value !== "" || !String(template["op"]).includes("slot"))
                : badIdentifier
  return bad.map((value) => ({ ...template, [field]: value }))
})

describe("fuzzed invalid input over Postgres", () => {
  it("answers thousands of invalid messages with clear errors and changes no row", async () => {
    // Something to change, so an applied invalid command would show.
    await send(JSON.stringify({ op: "adjust", user, meter: "analysis", amount: 100, id: "seed" })).catch(
      () => []
    )
    const before = await fingerprint()
    counts.messages = 0
    counts.invalidRequest = 0

    await fc.assert(
      fc.asyncProperty(mutated, async (command) => {
        const results = await send(JSON.stringify(command), "ops")
        expect(results.length <= 1).toBe(true)
      }),
      { numRuns: 2_000 }
    )
    await fc.assert(
      fc.asyncProperty(fc.array(mutated, { minLength: 1, maxLength: 30 }), async (batch) => {
        const results = await send(JSON.stringify(batch), "ops")
        expect(results).toHaveLength(batch.length)
      }),
      { numRuns: 300 }
    )
    await fc.assert(
      fc.asyncProperty(
        fc.oneof(
          fc.string().filter((text) => {
            try {
              JSON.parse(text)
              return false
            } catch {
              return true
            }
          }),
          fc.uint8Array({ minLength: 1, maxLength: 64 }).map((bytes) => new Uint8Array([0xff, ...bytes]))
        ),
        async (body) => {
          expect(await send(body)).toEqual([])
        }
      ),
      { numRuns: 300 }
    )
    // Over the limits: a batch of 1 001 and a body over 1 MiB.
    expect(await send(JSON.stringify(Array.from({ length: 1_001 }, () => templates[0])))).toEqual([])
    expect(
      await send(JSON.stringify({ op: "get_usage", user, pad: "x".repeat(1_048_577) })).catch(() => [])
    ).toEqual([])
    // Another partition's user.
    const stranger = Array.from({ length: 64 }, (_, index) => `stranger-${index}`).find(
      (candidate) => partitionOf(candidate, partitions) !== partitionOf(user, partitions)
    )!
    expect(
      await send(JSON.stringify({ op: "reserve", user: stranger, meter: "analysis", amount: 1, id: "x" }))
    ).toEqual([{ status: "wrong_partition" }])

    expect(await fingerprint()).toBe(before)
    const usage = await nc.request(subject("admin"), JSON.stringify({ op: "get_usage", user }), {
      timeout: 5_000
    })
    expect(usage.json()).toMatchObject({ status: "ok" })
    expect(counts.messages).toBeGreaterThanOrEqual(2_600)
  }, 180_000)
})

describe("identifiers holding U+0000 over Postgres", () => {
  it("are granted, charged, refused on reuse and counted like any other (PROTOCOL.md: 1 to 256 UTF-8 bytes)", async () => {
    const nulUser = "nul\u0000user"
    const call = async (command: Record<string, unknown>, kind: "ops" | "admin" = "ops") => {
      const subjectOf = `${prefix}.v1.${partitionOf(nulUser, partitions)}.${kind}`
      const reply = await nc.request(subjectOf, JSON.stringify(command), { timeout: 5_000 })
      return reply.json<Record<string, unknown>>()
    }
    const hold = { user: nulUser, id: "job\u0000" }
    expect(await call({ op: "reserve", ...hold, meter: "analysis", amount: 5 })).toMatchObject({
      status: "reserved",
      id: "job\u0000"
    })
    expect(await call({ op: "consume", ...hold, amount: 2, key: "k\u0000" })).toMatchObject({
      status: "consumed"
    })
    expect(await call({ op: "consume", ...hold, amount: 2, key: "k\u0000" })).toMatchObject({
      status: "exists"
    })
    expect(await call({ op: "commit", ...hold, amount: 3 })).toMatchObject({ status: "committed", used: 3 })
    expect(await call({ op: "reserve", ...hold, meter: "analysis", amount: 5 })).toMatchObject({
      status: "closed"
    })
    expect(
      await call({ op: "adjust", user: nulUser, meter: "analysis", amount: 4, id: "\u0000" })
    ).toMatchObject({ status: "adjusted", used: 7 })
    expect(await call({ op: "acquire_slot", user: nulUser, job: "\u0000\u0000" })).toMatchObject({
      status: "acquired"
    })
    const usage = await call({ op: "get_usage", user: nulUser })
    expect(usage["slots"]).toMatchObject({ held: 1, jobs: [{ job: "\u0000\u0000" }] })
    expect((usage["meters"] as Array<Record<string, unknown>>)[0]).toMatchObject({
      meter: "analysis",
      used: 7
    })
  })
})
