/**
 * Every partition is served again within a lease and a round of a single fault (issue 34, item 4),
 * including the faults that leave the ownership pool working, so that the faulty member keeps renewing
 * what it can no longer serve:
 *
 * - its store fails: its pool stuck (connections silent), or its server refusing it. Loads and writes
 *   fail (the partitions' commands answered `unavailable`) while the ownership pool renews the leases.
 *   Before, nothing gave them up: unserved for as long as the fault. Now the member checks its store
 *   as a load uses it (the doubts settled, then a round trip) and gives everything up, as it does when
 *   cut off from NATS, once the checks have failed for the grace; back, it claims its share again.
 * - a step-down that does not end (the requests in flight wait on a stuck store) after its member lock
 *   was lost and taken again: its member may not claim those partitions back before the step-down ends,
 *   and the others, at their counts, did not either. Now a member that cannot take its whole share says
 *   so (it heartbeats as leaving and releases the leases it no longer serves): the others' counts grow
 *   and they claim.
 *
 * Two members, the real ownership tables, their rounds running as serve runs them (runOwnership).
 */
import { Context, Effect, Exit, Fiber, Layer, Scope } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import type { OwnershipOptions } from "../../src/cluster/PartitionOwnership.js"
import { makeOwnershipState, memberLockLost, runOwnership } from "../../src/cluster/PartitionOwnership.js"
import { Store } from "../../src/store/Store.js"
import type { StoreShape } from "../../src/store/Store.js"
import { migrate } from "../../src/store/postgres/migrate.js"
import { makeOwnershipQueries } from "../../src/store/postgres/ownership.js"
import { postgresStoreLayer } from "../../src/store/postgres/PostgresStore.js"
import { createTestSchema } from "../support/database.js"
import { sleep } from "../support/operations.js"
import { ownerRows } from "../support/ownershipMembers.js"
import type { TcpProxy } from "../support/tcpProxy.js"
import { startTcpProxy } from "../support/tcpProxy.js"

const database = createTestSchema("ownership_unserved")
const pool = database.pool({ max: 8 })
const queries = makeOwnershipQueries(pool, database.schema)
const partitions = 4
const leaseMs = 3_000
const renewIntervalMs = leaseMs / 3
/** The bound: a lease and a round, plus what the statements of a loaded machine take. */
const unservedMsMax = leaseMs + renewIntervalMs + 500

beforeAll(() => Effect.runPromise(migrate(pool, database.schema)))
afterAll(() => database.drop())

const member = (owner: string, extra: Partial<OwnershipOptions> = {}): OwnershipOptions => ({
  state: makeOwnershipState(owner),
  queries,
  partitions,
  leaseMs,
  renewIntervalMs,
  serve: () => Effect.void,
  stop: () => Effect.void,
  log: () => {},
  ...extra
})

/** Runs each member's ownership loop until the returned function stops them (as leaving does). */
const runAll = (members: ReadonlyArray<OwnershipOptions>) => {
  const fibers = members.map((each) => Effect.runFork(runOwnership(each)))
  return async () => {
    for (const each of members) each.state.leaving = true
    await Effect.runPromise(Effect.all(fibers.map((fiber) => Fiber.interrupt(fiber))))
  }
}

/** Waits until `done` holds, up to `ms`; returns how long it took, or undefined. */
const within = async (ms: number, done: () => Promise<boolean> | boolean): Promise<number | undefined> => {
  const start = performance.now()
  while (performance.now() - start < ms) {
    if (await done()) return Math.round(performance.now() - start)
    await sleep(50)
  }
  return undefined
}

const servedBy = (options: OwnershipOptions): Array<number> =>
  Array.from({ length: partitions }, (_, partition) => partition).filter((partition) =>
    options.state.servable(partition)
  )

const balanced = (members: ReadonlyArray<OwnershipOptions>) => () =>
  members.every((each) => servedBy(each).length === partitions / members.length)

const fresh = async () => {
  await pool.query(`truncate "${database.schema}".members, "${database.schema}".partition_owners`)
}

describe("a member whose store has failed while its ownership pool works", () => {
  let proxy: TcpProxy
  let scope: Scope.Closeable
  let store: StoreShape

  beforeAll(async () => {
    proxy = await startTcpProxy("127.0.0.1", Number(new URL(database.connectionString).port || 5432))
    const url = new URL(database.connectionString)
    url.host = `127.0.0.1:${proxy.port}`
    scope = Effect.runSync(Scope.make())
    const context = await Effect.runPromise(
      Scope.provide(scope)(
        Layer.build(
          postgresStoreLayer({
            connectionString: url.toString(),
            schema: database.schema,
            prefix: "ownership-unserved",
            partitions,
            queryTimeoutMs: 30_000
          })
        )
      )
    )
    store = Context.get(context, Store)
  })

  afterAll(async () => {
    proxy?.resume()
    await Effect.runPromise(Scope.close(scope, Exit.void))
    await proxy?.close()
  })

  const faults = [
    {
      name: "its pool stuck (every connection silent)",
      fail: () => proxy.silence(),
      heal: () => proxy.resume()
    },
    { name: "its server refusing it", fail: () => proxy.cut(), heal: () => proxy.restore() }
  ]

  for (const fault of faults)
    it(`gives its partitions up within a lease and a round: ${fault.name}`, async () => {
      await fresh()
      const faulty = member(`store-${faults.indexOf(fault)}-faulty`, {
        checkStore: store.check ?? store.ping
      })
      const other = member(`store-${faults.indexOf(fault)}-other`)
      const stop = runAll([faulty, other])
      let healed = true
      const heal = async () => {
        if (healed) return
        healed = true
        await fault.heal()
      }
      try {
        expect(await within(10_000, balanced([faulty, other]))).toBeDefined()
        const faultAt = performance.now()
        healed = false
        await fault.fail()
        const tookOverMs = await within(3 * leaseMs, () => servedBy(other).length === partitions)
        const rows = await ownerRows(pool, database.schema)
        console.log(
          `store ${fault.name}: the other member served every partition ` +
            (tookOverMs === undefined ? `not within ${3 * leaseMs} ms` : `${tookOverMs} ms after the fault`) +
            `; the faulty one serves [${servedBy(faulty).join(", ")}]; rows ${rows.map((row) => `${row.partition}:${row.owner}`).join(" ")}`
        )
        expect(tookOverMs).toBeDefined()
        expect(tookOverMs!).toBeLessThanOrEqual(unservedMsMax)
        expect(servedBy(faulty)).toEqual([])

        // Healed: it claims its share again.
        await heal()
        const backMs = await within(10_000, balanced([faulty, other]))
        console.log(
          `store healed: balanced again after ${backMs} ms (${Math.round(performance.now() - faultAt)} ms after the fault)`
        )
        expect(backMs).toBeDefined()
      } finally {
        await heal()
        await stop()
      }
    }, 60_000)
})

describe("a step-down that does not end after the member lock was lost and taken again", () => {
  it("leaves no partition unserved for longer than a lease and a round", async () => {
    await fresh()
    let openGate = (): void => {}
    const gate = new Promise<void>((resolve) => (openGate = resolve))
    let stuck = false
    // As serve's stop while the requests in flight wait on a stuck store: it does not end.
    const stuckMember = member("stepping-down", {
      stop: () => (stuck ? Effect.promise(() => gate) : Effect.void)
    })
    const other = member("at-its-count")
    const stop = runAll([stuckMember, other])
    try {
      expect(await within(10_000, balanced([stuckMember, other]))).toBeDefined()
      const itsPartitions = servedBy(stuckMember)
      stuck = true
      const lostAt = performance.now()
      const stepDown = Effect.runFork(memberLockLost(stuckMember, "test: the member lock's session ended"))
      // Taken again at once (as a failover reaching a new primary); its step-down still runs.
      stuckMember.state.memberLockHeld = true
      stuckMember.state.wake()
      const servedAgainMs = await within(3 * leaseMs, () =>
        itsPartitions.every(
          (partition) => other.state.servable(partition) || stuckMember.state.servable(partition)
        )
      )
      console.log(
        `step-down stuck: partitions [${itsPartitions.join(", ")}] served again ` +
          (servedAgainMs === undefined
            ? `not within ${3 * leaseMs} ms`
            : `${servedAgainMs} ms after the lock's loss`) +
          `; the other serves [${servedBy(other).join(", ")}], the stuck member [${servedBy(stuckMember).join(", ")}]`
      )
      expect(servedAgainMs).toBeDefined()
      expect(servedAgainMs!).toBeLessThanOrEqual(unservedMsMax)

      // The step-down ends: the member takes its share again.
      openGate()
      await Effect.runPromise(Fiber.join(stepDown))
      const backMs = await within(10_000, balanced([stuckMember, other]))
      console.log(
        `step-down ended: balanced again after ${backMs} ms (${Math.round(performance.now() - lostAt)} ms after the loss)`
      )
      expect(backMs).toBeDefined()
    } finally {
      openGate()
      await stop()
    }
  }, 60_000)
})
