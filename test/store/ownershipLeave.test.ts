/**
 * A graceful leave whose ownership round is stuck in a claim for longer than the leave waits: the claim
 * still lands in Postgres afterwards, and the round must hand those leases straight back instead of
 * serving them, or the partitions stay held by a process that is gone until the lease runs out.
 */
import { Deferred, Effect, Exit, Fiber } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import type { OwnershipOptions } from "../../src/cluster/PartitionOwnership.js"
import { leaveOwnership, makeOwnershipState, runOwnership } from "../../src/cluster/PartitionOwnership.js"
import { migrate } from "../../src/store/postgres/migrate.js"
import { makeOwnershipQueries } from "../../src/store/postgres/ownership.js"
import { createTestSchema } from "../support/database.js"

const database = createTestSchema("ownership_leave")
const pool = database.pool({ max: 4 })
const partitions = 4
const leaseMs = 200

beforeAll(() => Effect.runPromise(migrate(pool, database.schema)))
afterAll(() => database.drop())

const leasesHeldBy = async (owner: string): Promise<Array<number>> => {
  const result = await pool.query<{ partition: number }>(
    `select partition from "${database.schema}".partition_owners
     where owner = $1 and lease_expires_at > 0 order by partition`,
    [owner]
  )
  return result.rows.map((row) => row.partition)
}

describe("leaving while a claim is in flight", () => {
  it("releases what the late claim took and serves none of it", async () => {
    const real = makeOwnershipQueries(pool, database.schema)
    const claimStarted = Deferred.makeUnsafe<void>()
    const claimMayRun = Deferred.makeUnsafe<void>()
    const state = makeOwnershipState("leaving-owner")
    const served: Array<number> = []
    const options: OwnershipOptions = {
      state,
      // The claim waits until the leave has given up waiting and released everything, then runs.
      queries: {
        ...real,
        claim: (owner, wanted, ms) =>
          Effect.andThen(
            Effect.andThen(
              Effect.sync(() => Deferred.doneUnsafe(claimStarted, Exit.void)),
              Deferred.await(claimMayRun)
            ),
            real.claim(owner, wanted, ms)
          )
      },
      partitions,
      leaseMs,
      renewIntervalMs: 50,
      serve: (claimed) => Effect.sync(() => served.push(...claimed)),
      stop: () => Effect.void,
      log: () => {}
    }

    const loop = Effect.runFork(runOwnership(options))
    await Effect.runPromise(Deferred.await(claimStarted))
    const leaveStarted = performance.now()
    await Effect.runPromise(leaveOwnership(options))
    // The leave waited for the round at most a lease, then released and left.
    expect(performance.now() - leaveStarted).toBeGreaterThanOrEqual(leaseMs - 5)
    expect(await leasesHeldBy(state.owner)).toEqual([])

    // Now the stuck claim reaches Postgres and takes every partition for the owner that left.
    Deferred.doneUnsafe(claimMayRun, Exit.void)
    await Effect.runPromise(Fiber.await(loop))

    expect(served).toEqual([])
    expect(await leasesHeldBy(state.owner)).toEqual([])
    const claimedRows = await pool.query<{ count: string }>(
      `select count(*) from "${database.schema}".partition_owners where owner = $1`,
      [state.owner]
    )
    // The claim did land (so the release above is what freed the leases), for every partition.
    expect(Number(claimedRows.rows[0]!.count)).toBe(partitions)
  })
})
