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

  it("fails to build, with StoreUnavailable, when Postgres does not answer", async () => {
    const layer = postgresStoreLayer({
      connectionString: "postgres://postgres@127.0.0.1:1/test",
      schema: database.schema,
      prefix: "quota",
      partitions: 64
    })
    const error = await Effect.runPromise(Effect.flip(Effect.provide(storeOf, layer)))
    expect(error._tag).toBe("StoreUnavailable")
  })
})
