/**
 * The real Postgres of this machine for tests: DATABASE_URL, or the trust-auth server on 127.0.0.1.
 * Each test file takes its own schema (a random name) and drops it at the end, so files run in
 * parallel on one database without seeing each other. No mocks: a store test that passes here ran
 * its SQL on Postgres.
 */
import { randomUUID } from "node:crypto"
import { Effect, Exit, Scope } from "effect"
import pg from "pg"

export const testDatabaseUrl = process.env["DATABASE_URL"] ?? "postgres://postgres@127.0.0.1:5432/test"

export interface TestSchema {
  readonly schema: string
  readonly connectionString: string
  /** A pool for this test file; every pool made here is closed by `drop`. */
  readonly pool: (options?: { readonly max?: number }) => pg.Pool
  /** A second, fresh schema name in the same cleanup (for tests that need an empty one). */
  readonly freshSchema: (label: string) => string
  /** Closes the pools and drops every schema this helper named. Fails if a pool still had clients checked out. */
  readonly drop: () => Promise<void>
}

/** A schema name no other test run uses: `test_<label>_<random>`. */
export const randomSchemaName = (label: string): string =>
  `test_${label}_${randomUUID().replaceAll("-", "").slice(0, 12)}`

export const createTestSchema = (label: string): TestSchema => {
  const schema = randomSchemaName(label)
  const schemas = [schema]
  const pools: Array<pg.Pool> = []
  const pool = (options: { readonly max?: number } = {}): pg.Pool => {
    const created = new pg.Pool({ connectionString: testDatabaseUrl, max: options.max ?? 10 })
    // Tests end pools on purpose; an idle client's error must not crash the runner.
    created.on("error", () => {})
    pools.push(created)
    return created
  }
  const freshSchema = (extraLabel: string): string => {
    const name = randomSchemaName(`${label}_${extraLabel}`)
    schemas.push(name)
    return name
  }
  const drop = async (): Promise<void> => {
    // A checked-out client at the end means a code path forgot to release it: a leak to report.
    const leaked = pools.filter((each) => !each.ended && each.totalCount - each.idleCount > 0).length
    await Promise.all(pools.filter((each) => !each.ended).map((each) => each.end()))
    const admin = new pg.Client({ connectionString: testDatabaseUrl })
    await admin.connect()
    for (const name of schemas) await admin.query(`drop schema if exists "${name}" cascade`)
    await admin.end()
    if (leaked > 0) throw new Error(`${leaked} pool(s) still had clients checked out at the end`)
  }
  return { schema, connectionString: testDatabaseUrl, pool, freshSchema, drop }
}

/** Runs a scoped constructor in a scope the test closes itself (e.g. a store shared by a file's tests). */
export const acquireScoped = async <A, E>(
  acquire: Effect.Effect<A, E, Scope.Scope>
): Promise<{ readonly value: A; readonly close: () => Promise<void> }> => {
  const scope = Effect.runSync(Scope.make())
  const value = await Effect.runPromise(Scope.provide(scope)(acquire))
  return { value, close: () => Effect.runPromise(Scope.close(scope, Exit.void)) }
}
