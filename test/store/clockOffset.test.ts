/**
 * A process whose wall clock is further from Postgres's than QUOTA_CLOCK_OFFSET_MAX_MS answers for no
 * partition, gives its partitions up and says why; within the bound it serves; a step of its wall
 * clock between two rounds (a month ahead, say) stops its answers at once, before any decision reads
 * the stepped clock and moves users' periods (their floors) into the future. The process's clock is
 * injected, offset from the machine's; Postgres is the real one.
 */
import { Effect } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { makeClockOffsetState } from "../../src/cluster/ClockOffset.js"
import type { OwnershipOptions } from "../../src/cluster/PartitionOwnership.js"
import { makeOwnershipState, ownershipRound } from "../../src/cluster/PartitionOwnership.js"
import { migrate } from "../../src/store/postgres/migrate.js"
import { makeOwnershipQueries } from "../../src/store/postgres/ownership.js"
import { createTestSchema } from "../support/database.js"

const database = createTestSchema("clock_offset")
const pool = database.pool({ max: 4 })
const partitions = 4
const offsetMaxMs = 500
const monthMs = 31 * 86_400_000

beforeAll(() => Effect.runPromise(migrate(pool, database.schema)))
afterAll(() => database.drop())

/** A process whose wall clock reads the machine's plus `offset.ms` (changed by the test). */
const processWith = (owner: string, offset: { ms: number }) => {
  const clock = makeClockOffsetState(offsetMaxMs, () => Date.now() + offset.ms)
  const state = makeOwnershipState(owner, clock)
  const told: Array<string | undefined> = []
  const served: Array<number> = []
  const options: OwnershipOptions = {
    state,
    queries: makeOwnershipQueries(pool, database.schema),
    partitions,
    leaseMs: 60_000,
    renewIntervalMs: 20_000,
    serve: (claimed) => Effect.sync(() => void served.push(...claimed)),
    stop: (stopped) => Effect.sync(() => void stopped.forEach((p) => served.splice(served.indexOf(p), 1))),
    log: () => {},
    onClockChange: (beyond) => void told.push(beyond)
  }
  const servable = () => Array.from({ length: partitions }, (_, p) => p).filter((p) => state.servable(p))
  return { state, options, told, served, servable, round: () => Effect.runPromise(ownershipRound(options)) }
}

describe("a process's clock against Postgres's", () => {
  const rows = [
    { name: "2 s ahead", offsetMs: 2_000 },
    { name: "2 s behind", offsetMs: -2_000 },
    { name: "just past the bound", offsetMs: offsetMaxMs + 200 }
  ]
  it.each(rows)("$name: serves no partition, claims none and says why", async ({ offsetMs }) => {
    const process = processWith(`off-${offsetMs}`, { ms: offsetMs })
    await process.round()
    expect({ servable: process.servable(), held: process.state.epochs.size }).toEqual({
      servable: [],
      held: 0
    })
    expect(process.told).toHaveLength(1)
    expect(process.told[0]).toMatch(/beyond QUOTA_CLOCK_OFFSET_MAX_MS \(500 ms\)/)
    expect(process.told[0]).toMatch(offsetMs > 0 ? /ahead of Postgres's/ : /behind Postgres's/)
    // Told once per change, not every round.
    await process.round()
    expect(process.told).toHaveLength(1)
  })

  it("within the bound it serves; a month's step of its clock stops it at once and it gives all up", async () => {
    const offset = { ms: 100 }
    const process = processWith("stepping", offset)
    await process.round()
    expect(process.servable()).toEqual([0, 1, 2, 3])
    expect(process.told).toEqual([])

    // The wall clock jumps a month ahead between two rounds: no decision may read it.
    offset.ms = monthMs
    expect(process.servable()).toEqual([])
    await process.round()
    expect(process.state.epochs.size).toBe(0)
    expect(process.told).toHaveLength(1)
    expect(process.told[0]).toMatch(/ahead of Postgres's/)
    const rows = await pool.query<{ owner: string; lease_expires_at: string }>(
      `select owner, lease_expires_at from "${database.schema}".partition_owners order by partition`
    )
    expect(rows.rows.map((row) => Number(row.lease_expires_at))).toEqual([0, 0, 0, 0])

    // Back within the bound: it says so and claims again.
    offset.ms = 0
    await process.round()
    expect(process.told).toHaveLength(2)
    expect(process.told[1]).toBeUndefined()
    expect(process.servable()).toEqual([0, 1, 2, 3])
  })
})
