/** The production wiring: postgresStoreLayer migrates, checks settings and provides the Store service. */
import { Effect } from "effect"
import { afterAll, describe, expect, it } from "vitest"
import { Store } from "../../src/store/Store.js"
import { postgresStoreLayer } from "../../src/store/postgres/PostgresStore.js"
import { createTestSchema } from "../support/database.js"
import { loadUser } from "../support/loadUser.js"

const database = createTestSchema("layer")
afterAll(() => database.drop())

const now = Date.UTC(2026, 10, 15, 12)
const storeOf = Effect.gen(function* () {
  return yield* Store
})

describe("postgresStoreLayer", () => {
  it("provides a Store that writes and loads, on a schema it migrated itself", async () => {
    const layer = postgresStoreLayer({
      connectionString: database.connectionString,
      schema: database.schema,
      prefix: "quota",
      partitions: 64
    })
    const loaded = await Effect.runPromise(
      Effect.gen(function* () {
        const store = yield* Store
        yield* store.write([
          { kind: "plan", user: "layer-user", plan: "pro" },
          { kind: "slot", user: "layer-user", job: "j", leaseExpiresAt: now }
        ])
        return yield* loadUser(store, "layer-user", now)
      }).pipe(Effect.provide(layer))
    )
    expect(loaded.plan).toBe("pro")
    expect(loaded.slots).toEqual([{ job: "j", leaseExpiresAt: now }])
  })

  it("fails to build on a database created with another partition count", async () => {
    const layer = postgresStoreLayer({
      connectionString: database.connectionString,
      schema: database.schema,
      prefix: "quota",
      partitions: 16
    })
    const error = await Effect.runPromise(Effect.flip(Effect.provide(storeOf, layer)))
    expect(error).toMatchObject({
      _tag: "SettingsMismatch",
      setting: "partitions",
      stored: 64,
      configured: 16
    })
  })

  it("waits while no server answers, trying again, then fails to build with StoreUnavailable", async () => {
    const attempts: Array<string> = []
    const layer = postgresStoreLayer({
      connectionString: "postgres://postgres@127.0.0.1:1/test",
      schema: database.schema,
      prefix: "quota",
      partitions: 64,
      startWaitMs: 2_500,
      onStartWait: (attempt, reason) => attempts.push(`${attempt}: ${reason}`)
    })
    const startedAt = performance.now()
    const error = await Effect.runPromise(Effect.flip(Effect.provide(storeOf, layer)))
    const waitedMs = performance.now() - startedAt
    expect(error._tag).toBe("StoreUnavailable")
    // Tried every storeStartRetryMs (1 s) for the wait: attempts 1, 2 and 3 told, the last one failed.
    expect(attempts.map((line) => line.split(":")[0])).toEqual(["1", "2", "3"])
    expect(attempts[0]).toContain("ECONNREFUSED")
    expect(waitedMs).toBeGreaterThanOrEqual(2_500)
  })

  it("fails to build at once when the server answers with a refusal", async () => {
    const attempts: Array<number> = []
    const layer = postgresStoreLayer({
      connectionString: `${database.connectionString.replace(/\/[^/?]*(\?|$)/, "/no_such_database$1")}`,
      schema: database.schema,
      prefix: "quota",
      partitions: 64,
      onStartWait: (attempt) => attempts.push(attempt)
    })
    const error = await Effect.runPromise(Effect.flip(Effect.provide(storeOf, layer)))
    expect(error._tag).toBe("StoreUnavailable")
    expect(attempts).toEqual([])
  })
})
