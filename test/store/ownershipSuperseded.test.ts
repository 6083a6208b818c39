/**
 * A write finds its partition's epoch superseded while an ownership round is in flight, and the other
 * member has already handed the partition back. The round must not claim it again before it has stepped
 * down (stopped taking its messages, dropped its actors): a fresh epoch over actors still resident from
 * the old one would let their stale memory decide, and write, under the new epoch.
 */
import { Effect } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import type { OwnershipOptions } from "../../src/cluster/PartitionOwnership.js"
import { makeOwnershipState, ownershipRound } from "../../src/cluster/PartitionOwnership.js"
import { migrate } from "../../src/store/postgres/migrate.js"
import { makeOwnershipQueries } from "../../src/store/postgres/ownership.js"
import { createTestSchema } from "../support/database.js"

const database = createTestSchema("ownership_superseded")
const pool = database.pool({ max: 4 })
const partitions = 4
const leaseMs = 60_000
const supersededPartition = 2

beforeAll(() => Effect.runPromise(migrate(pool, database.schema)))
afterAll(() => database.drop())

describe("a write superseded while a round is in flight", () => {
  it("steps down from the partition before it claims it again", async () => {
    const real = makeOwnershipQueries(pool, database.schema)
    const state = makeOwnershipState("superseded-owner")
    const events: Array<string> = []
    let supersedeDuringRenew = false
    let firstEpoch = 0
    const options: OwnershipOptions = {
      state,
      queries: {
        ...real,
        // As a write failing its fence check while the round's renew is on the wire.
        renew: (owner, epochs, ms) =>
          Effect.andThen(
            Effect.sync(() => {
              if (!supersedeDuringRenew) return
              supersedeDuringRenew = false
              state.fence.superseded([{ partition: supersededPartition, epoch: firstEpoch }])
            }),
            real.renew(owner, epochs, ms)
          )
      },
      partitions,
      leaseMs,
      renewIntervalMs: 1_000,
      serve: (served) => Effect.sync(() => events.push(...served.map((partition) => `serve ${partition}`))),
      stop: (stopped) => Effect.sync(() => events.push(...stopped.map((partition) => `stop ${partition}`))),
      log: () => {}
    }

    await Effect.runPromise(ownershipRound(options))
    expect([...state.epochs.keys()].sort()).toEqual([0, 1, 2, 3])
    firstEpoch = state.epochs.get(supersededPartition)!

    // Another member took the partition (bumping its epoch) and has since released it.
    await pool.query(
      `update "${database.schema}".partition_owners
       set owner = 'other-owner', epoch = epoch + 1, lease_expires_at = 0 where partition = $1`,
      [supersededPartition]
    )
    events.length = 0
    supersedeDuringRenew = true
    await Effect.runPromise(ownershipRound(options))
    // The round the fence woke: steps down, then may claim afresh.
    await Effect.runPromise(ownershipRound(options))

    expect(events).toEqual([`stop ${supersededPartition}`, `serve ${supersededPartition}`])
    expect(state.epochs.get(supersededPartition)).toBe(firstEpoch + 2)
    expect(state.servable(supersededPartition)).toBe(true)

    // A write fenced with the first epoch fails late, after the fresh claim: it says nothing of the
    // new epoch, so the process keeps serving the partition (no needless step-down and claim).
    events.length = 0
    state.fence.superseded([{ partition: supersededPartition, epoch: firstEpoch }])
    await Effect.runPromise(ownershipRound(options))
    expect(events).toEqual([])
    expect(state.epochs.get(supersededPartition)).toBe(firstEpoch + 2)
    // A write fenced with the current epoch that fails does step it down.
    state.fence.superseded([{ partition: supersededPartition, epoch: firstEpoch + 2 }])
    expect(state.servable(supersededPartition)).toBe(false)
    await Effect.runPromise(ownershipRound(options))
    expect(events[0]).toBe(`stop ${supersededPartition}`)
  })
})
