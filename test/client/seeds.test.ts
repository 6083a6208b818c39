/**
 * The seeds' races through the SDK, with real concurrency, against the coordinator on this machine's
 * NATS and Postgres (a schema of this file's own). Each row is a seed's scenario and what the
 * protocol promises for it.
 */
import { connect } from "@nats-io/transport-node"
import { Context, Effect, Exit, Layer, Scope } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { coordinatorLayer } from "../../src/actors/Coordinator.js"
import { QuotaClient } from "../../src/client/index.js"
import { defaultConfig } from "../../src/domain/config.js"
import { postgresStoreLayer } from "../../src/store/postgres/PostgresStore.js"
import { makeLogger } from "../../src/transport/log.js"
import { NatsServer, natsServerLayer } from "../../src/transport/NatsServer.js"
import { createTestSchema } from "../support/database.js"
import { randomPrefix } from "../support/processes.js"

const database = createTestSchema("seeds")
const prefix = randomPrefix("seeds")
const partitions = 16
let scope: Scope.Closeable
let client: QuotaClient

beforeAll(async () => {
  const store = postgresStoreLayer({
    connectionString: database.connectionString,
    schema: database.schema,
    prefix,
    partitions
  })
  const layer = natsServerLayer({
    servers: "nats://127.0.0.1:4222",
    prefix,
    partitions,
    logger: makeLogger("silent")
  }).pipe(Layer.provide(coordinatorLayer({ config: defaultConfig, partitions }).pipe(Layer.provide(store))))
  scope = Effect.runSync(Scope.make())
  const context = await Effect.runPromise(Layer.buildWithScope(layer, scope))
  Context.get(context, NatsServer)
  client = new QuotaClient(await connect({ servers: "127.0.0.1:4222" }), { prefix, partitions })
})

afterAll(async () => {
  await client?.close()
  await Effect.runPromise(Scope.close(scope, Exit.void))
  await database.drop()
})

let counter = 0
const freshUser = (label: string) => `${label}-${(counter += 1)}-${prefix}`
const megabytes = 1_000_000

describe("the seeds' races through the SDK, on NATS and Postgres", () => {
  it("000: 4 985 of 5 000 used, two concurrent requests of 10 -> exactly one reserved", async () => {
    const user = freshUser("adr21")
    expect((await client.adjust({ user, meter: "analysis", amount: 4_985, id: "used" })).status).toBe(
      "adjusted"
    )
    const results = await Promise.all(
      ["a", "b"].map((id) => client.reserve({ user, meter: "analysis", amount: 10, id }))
    )
    expect(results.map((result) => result.status).sort()).toEqual(["insufficient_quota", "reserved"])
  })

  it("004: 400 000 tokens, three concurrent 350 000 analyses -> one reserved, two refused with pendingHolds", async () => {
    const user = freshUser("tokens")
    const results = await Promise.all(
      ["a", "b", "c"].map((id) => client.reserve({ user, meter: "tokens", amount: 350_000, id }))
    )
    const reserved = results.filter((result) => result.status === "reserved")
    const refused = results.filter((result) => result.status === "insufficient_quota")
    expect(reserved).toHaveLength(1)
    expect(refused).toHaveLength(2)
    for (const result of refused)
      expect(result).toMatchObject({ requested: 350_000, pendingHolds: 1, available: 50_000 })
    const id = reserved[0]!.status === "reserved" ? reserved[0]!.id : ""
    await client.consume({ user, id, amount: 100_000, key: "step-1" })
    await client.consume({ user, id, amount: 100_000, key: "step-2" })
    const committed = await client.commit({ user, id, amount: 280_000 })
    expect(committed).toMatchObject({ status: "committed", used: 280_000, reserved: 0, consumed: 280_000 })
  })

  it("003: 800 of 1 000 MB, uploads of 100 and 150 MB -> exactly one; release restores; adjust refunds a delete", async () => {
    const user = freshUser("storage")
    await client.adjust({ user, meter: "storage_bytes", amount: 800 * megabytes, id: "existing" })
    const results = await Promise.all([
      client.reserve({ user, meter: "storage_bytes", amount: 100 * megabytes, id: "upload-100" }),
      client.reserve({ user, meter: "storage_bytes", amount: 150 * megabytes, id: "upload-150" })
    ])
    const granted = results.filter((result) => result.status === "reserved")
    expect(granted).toHaveLength(1)
    const grantedId = granted[0]!.status === "reserved" ? granted[0]!.id : ""
    const released = await client.release({ user, id: grantedId })
    expect(released).toMatchObject({ status: "released", available: 200 * megabytes })
    const refund = await client.adjust({
      user,
      meter: "storage_bytes",
      amount: -300 * megabytes,
      id: "delete-old"
    })
    expect(refund).toMatchObject({ status: "adjusted", used: 500 * megabytes })
  })

  it("002: a Free user's 10 concurrent acquire_slot -> 1 acquired, 9 busy in 30-40 s; Pro gets 3", async () => {
    const free = freshUser("free")
    const results = await Promise.all(
      Array.from({ length: 10 }, (_, index) => client.acquireSlot({ user: free, job: `job-${index}` }))
    )
    expect(results.filter((result) => result.status === "acquired")).toHaveLength(1)
    const busy = results.flatMap((result) => (result.status === "busy" ? [result] : []))
    expect(busy).toHaveLength(9)
    for (const result of busy) {
      expect(result.retryAfterMs).toBeGreaterThanOrEqual(30_000)
      expect(result.retryAfterMs).toBeLessThanOrEqual(40_000)
    }
    const pro = freshUser("pro")
    expect((await client.setPlan({ user: pro, plan: "pro" })).status).toBe("ok")
    const proResults = await Promise.all(
      Array.from({ length: 4 }, (_, index) => client.acquireSlot({ user: pro, job: `job-${index}` }))
    )
    expect(proResults.map((result) => result.status).sort()).toEqual([
      "acquired",
      "acquired",
      "acquired",
      "busy"
    ])
  })

  it("002: a waitMs caller gets the slot within 100 ms of its release", async () => {
    const user = freshUser("waiter")
    expect((await client.acquireSlot({ user, job: "running" })).status).toBe("acquired")
    const waiting = client.acquireSlot({ user, job: "next", waitMs: 10_000 }).then((result) => ({
      result,
      at: performance.now()
    }))
    await new Promise((resolve) => setTimeout(resolve, 200))
    expect((await client.releaseSlot({ user, job: "running" })).status).toBe("released")
    // The release decision hands the slot to the waiter: both replies leave after the same commit.
    const releaseAnsweredAt = performance.now()
    const { result, at } = await waiting
    expect(result).toMatchObject({ status: "acquired", job: "next", held: 1 })
    expect(at - releaseAnsweredAt).toBeLessThan(100)
  })
})
