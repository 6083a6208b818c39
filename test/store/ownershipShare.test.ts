/**
 * Only what must move, moves (issue 22): members of one deployment, run round by round against the
 * real ownership tables. When a member dies, each survivor keeps every partition it holds and only the
 * dead member's partitions move; when one joins, about P/n move to it; every member ends with P/n
 * rounded down or up. (With p mod n over sorted members, a death made the survivors swap partitions.)
 */
import { Effect } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import type { OwnershipOptions, OwnershipState } from "../../src/cluster/PartitionOwnership.js"
import { makeOwnershipState, ownershipRound, shareCount } from "../../src/cluster/PartitionOwnership.js"
import { migrate } from "../../src/store/postgres/migrate.js"
import { makeOwnershipQueries } from "../../src/store/postgres/ownership.js"
import { createTestSchema } from "../support/database.js"

const database = createTestSchema("ownership_share")
const pool = database.pool({ max: 4 })
const partitions = 64
const leaseMs = 60_000

beforeAll(() => Effect.runPromise(migrate(pool, database.schema)))
afterAll(() => database.drop())

interface Member {
  readonly state: OwnershipState
  readonly options: OwnershipOptions
  /** Partitions it stopped serving since the last reset. */
  readonly stopped: Array<number>
}

const member = (owner: string): Member => {
  const state = makeOwnershipState(owner)
  const stopped: Array<number> = []
  return {
    state,
    stopped,
    options: {
      state,
      queries: makeOwnershipQueries(pool, database.schema),
      partitions,
      leaseMs,
      renewIntervalMs: 1_000,
      serve: () => Effect.void,
      stop: (partitionsStopped) => Effect.sync(() => stopped.push(...partitionsStopped)),
      log: () => {}
    }
  }
}

const rounds = async (members: ReadonlyArray<Member>, count: number): Promise<void> => {
  for (let round = 0; round < count; round += 1)
    for (const each of members) await Effect.runPromise(ownershipRound(each.options))
}

const held = (each: Member): Array<number> =>
  [...each.state.epochs.keys()].sort((left, right) => left - right)

const expectBalanced = (members: ReadonlyArray<Member>): void => {
  const counts = members.map((each) => each.state.epochs.size)
  expect(counts.reduce((sum, count) => sum + count, 0)).toBe(partitions)
  const fair = [Math.floor(partitions / members.length), Math.ceil(partitions / members.length)]
  for (const count of counts) expect(fair).toContain(count)
  const all = members.flatMap(held)
  expect(new Set(all).size).toBe(partitions)
}

describe("the share of each member", () => {
  it("counts P/n, the first P mod n members one more", () => {
    const members = ["a", "b", "c"]
    expect(members.map((owner) => shareCount(owner, members, 64))).toEqual([22, 21, 21])
    expect(shareCount("z", [], 64)).toBe(64)
  })

  it("keeps every survivor's partitions when a member dies, and moves about P/n when one joins", async () => {
    const [a, b, c] = ["member-a", "member-b", "member-c"].map(member) as [Member, Member, Member]
    await rounds([a, b, c], 4)
    expectBalanced([a, b, c])

    // c dies: its heartbeat and leases lapse (as the database sees them).
    const survivorsHeld = new Map([a, b].map((each) => [each, held(each)]))
    await pool.query(`update "${database.schema}".members set heartbeat_at = 0 where owner = $1`, [
      c.state.owner
    ])
    await pool.query(
      `update "${database.schema}".partition_owners set lease_expires_at = 0 where owner = $1`,
      [c.state.owner]
    )
    a.stopped.length = 0
    b.stopped.length = 0
    await rounds([a, b], 2)
    expectBalanced([a, b])
    for (const [survivor, before] of survivorsHeld) {
      expect(survivor.stopped).toEqual([])
      for (const partition of before) expect(survivor.state.epochs.has(partition)).toBe(true)
    }

    // d joins: a and b hand off what is beyond their new counts, d claims it.
    const d = member("member-d")
    a.stopped.length = 0
    b.stopped.length = 0
    await rounds([d, a, b], 3)
    expectBalanced([a, b, d])
    const moved = a.stopped.length + b.stopped.length
    console.log(`a member joining two: ${moved} of ${partitions} partitions moved (P/n = ${partitions / 3})`)
    expect(moved).toBe(d.state.epochs.size)
  })
})
