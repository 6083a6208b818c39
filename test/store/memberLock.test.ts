/**
 * The member lock a `serve` process holds (src/store/postgres/memberLock.ts) keeps its key when its
 * session ends and it is taken again (issue 34, item 3): the key is the process's identity in the
 * members table, and under a new key the process looked dead to the others until its next heartbeat.
 * Only when another session holds the key is a new one drawn. With the key it names the server the
 * lock was taken on, as migration 0010's member_lock_server() does.
 */
import { Effect, Exit, Scope } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { holdMemberLock } from "../../src/store/postgres/memberLock.js"
import { migrate } from "../../src/store/postgres/migrate.js"
import { memberLockNamespace } from "../../src/store/postgres/ownership.js"
import { createTestSchema } from "../support/database.js"
import { sleep, waitFor } from "../support/operations.js"
import { takeMemberLock } from "../support/ownershipMembers.js"

const database = createTestSchema("member_lock")
const admin = database.pool({ max: 4 })

beforeAll(() => Effect.runPromise(migrate(admin, database.schema)))
afterAll(() => database.drop())

/** Ends the sessions holding member lock `key`, as a restart or an administrator would. */
const endSessionsHolding = (key: number) =>
  admin.query(
    `select pg_terminate_backend(pid) from pg_locks
     where locktype = 'advisory' and granted and classid = $1::oid and objid = $2::oid`,
    [memberLockNamespace, key]
  )

describe("the member lock", () => {
  it("is taken again under the same key after its session ended, and names the server it was taken on", async () => {
    const scope = Effect.runSync(Scope.make())
    let locked = 0
    let lost = 0
    try {
      const lock = await Effect.runPromise(
        Scope.provide(scope)(
          holdMemberLock({
            connectionString: database.connectionString,
            schema: database.schema,
            onLost: () => (lost += 1),
            onLocked: () => (locked += 1)
          })
        )
      )
      const first = lock.key()
      expect(first).not.toBeNull()
      const server = (
        await admin.query<{ server: string }>(`select "${database.schema}".member_lock_server() as server`)
      ).rows[0]!.server
      expect(lock.server()).toBe(server)

      for (let loss = 1; loss <= 3; loss += 1) {
        await endSessionsHolding(first!)
        await waitFor(
          async () => (locked === loss + 1 ? true : undefined),
          5_000,
          () => `locked ${locked} times`
        )
        expect({ lost, key: lock.key(), server: lock.server() }).toEqual({ lost: loss, key: first, server })
      }

      // The key held by another session when the lock is taken again: a new key is drawn.
      await endSessionsHolding(first!)
      const other = await takeMemberLock(database.connectionString, first!)
      try {
        await waitFor(
          async () => (locked === 5 ? true : undefined),
          5_000,
          () => `locked ${locked} times`
        )
        expect(lock.key()).not.toBe(first)
        expect(lock.key()).not.toBeNull()
      } finally {
        await other.end()
      }
      await sleep(50)
    } finally {
      await Effect.runPromise(Scope.close(scope, Exit.void))
    }
  }, 30_000)
})
