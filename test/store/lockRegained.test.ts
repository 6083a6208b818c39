/**
 * Member lock lost and held again while the step-down still runs (issue 26, item 2), in one process
 * with the real Postgres store and fence. The step-down after a lock loss runs in a fiber of its own
 * and drops the actors only once the transport has answered what was in flight (here: a gate). Another
 * owner takes the partition meanwhile, charges the user and hands the partition back. Claimed again
 * while the pre-loss actor is still resident, its memory (used 10) granted `reserve 4000` under the
 * fresh epoch: 8 010 against a limit of 5 000. A claim must never meet memory from before it.
 */
import { Context, Effect, Fiber, Layer } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import type { CoordinatorShape } from "../../src/actors/Coordinator.js"
import { Coordinator, coordinatorLayer } from "../../src/actors/Coordinator.js"
import type { OwnershipOptions, OwnershipState } from "../../src/cluster/PartitionOwnership.js"
import { makeOwnershipState, memberLockLost, ownershipRound } from "../../src/cluster/PartitionOwnership.js"
import type { Command } from "../../src/domain/commands.js"
import { defaultConfig } from "../../src/domain/config.js"
import { partitionOf } from "../../src/domain/partition.js"
import type { Result } from "../../src/domain/results.js"
import { makeOwnershipQueries } from "../../src/store/postgres/ownership.js"
import { postgresStoreLayer } from "../../src/store/postgres/PostgresStore.js"
import { commitCommand, reserveCommand } from "../support/commands.js"
import { acquireScoped, createTestSchema } from "../support/database.js"
import { randomMemberLockKey, takeMemberLock } from "../support/ownershipMembers.js"

const database = createTestSchema("lock_regained")
const admin = database.pool({ max: 4 })
const partitions = 4
const leaseMs = 60_000
const user = "regained-user"
const partition = partitionOf(user, partitions)

interface Process {
  readonly state: OwnershipState
  readonly coordinator: CoordinatorShape
  readonly close: () => Promise<void>
}

/** A coordinator over the Postgres store, fenced and served by `owner`'s ownership state. */
const startProcess = async (owner: string): Promise<Process> => {
  const state = makeOwnershipState(owner)
  const layer = coordinatorLayer({
    config: defaultConfig,
    sweepIntervalMs: 0,
    actorIdleMs: 600_000,
    partitions,
    servingEpoch: state.servingEpoch
  }).pipe(
    Layer.provide(
      postgresStoreLayer({
        connectionString: database.connectionString,
        schema: database.schema,
        prefix: "lock-regained",
        partitions,
        fence: state.fence
      })
    )
  )
  const opened = await acquireScoped(
    Effect.map(Layer.build(layer), (context) => Context.get(context, Coordinator))
  )
  return { state, coordinator: opened.value, close: opened.close }
}

let first: Process
let other: Process

beforeAll(async () => {
  first = await startProcess("first-owner")
  other = await startProcess("other-owner")
})

afterAll(async () => {
  await first?.close()
  await other?.close()
  await database.drop()
})

const submit = (process: Process, command: Command): Promise<Result> =>
  Effect.runPromise(process.coordinator.submit(command))
const reserve = (id: string, amount: number): Command => reserveCommand(user, id, amount)
const commit = (id: string): Command => commitCommand(user, id)

describe("a member lock lost and held again while the step-down still runs", () => {
  it("claims no partition whose pre-loss actors are still resident; grants nothing from that memory", async () => {
    const queries = makeOwnershipQueries(admin, database.schema)
    let openGate = (): void => {}
    const gate = new Promise<void>((resolve) => {
      openGate = resolve
    })
    const key = randomMemberLockKey()
    let lock = await takeMemberLock(database.connectionString, key)
    const options: OwnershipOptions = {
      state: first.state,
      queries,
      partitions,
      leaseMs,
      renewIntervalMs: 1_000,
      lockKey: () => (first.state.memberLockHeld ? key : null),
      serve: () => Effect.void,
      // As serve's stopPartitions waiting for the requests in flight (up to 30 s), then the actors.
      stop: (stopped) =>
        Effect.andThen(
          Effect.promise(() => gate),
          first.coordinator.dropPartitions(stopped)
        ),
      log: () => {}
    }
    await Effect.runPromise(ownershipRound(options))
    expect(first.state.servable(partition)).toBe(true)
    expect(await submit(first, reserve("before", 10))).toMatchObject({ status: "reserved" })
    expect(await submit(first, commit("before"))).toMatchObject({ status: "committed", used: 10 })

    // The lock's session ends; the step-down waits at the gate with the actor (used 10) resident.
    await lock.end()
    const stepDown = Effect.runFork(memberLockLost(options, "the member lock's connection ended"))

    // The others take the first owner for dead: one claims the partition, charges 4 000, hands it back.
    const claimed = await Effect.runPromise(queries.claim("other-owner", [partition], leaseMs))
    expect([...claimed.keys()]).toEqual([partition])
    other.state.epochs.set(partition, claimed.get(partition)!)
    other.state.servableUntil.set(partition, {
      monotonicMs: performance.now() + leaseMs,
      wallMs: Date.now() + leaseMs
    })
    expect(await submit(other, reserve("elsewhere", 4_000))).toMatchObject({ status: "reserved" })
    expect(await submit(other, commit("elsewhere"))).toMatchObject({ status: "committed", used: 4_010 })
    await Effect.runPromise(queries.release("other-owner", claimed))
    other.state.epochs.delete(partition)
    await Effect.runPromise(other.coordinator.dropPartitions([partition]))

    // The lock is held again, the step-down still at the gate: a round runs.
    lock = await takeMemberLock(database.connectionString, key)
    first.state.memberLockHeld = true
    await Effect.runPromise(ownershipRound(options))
    const whileSteppingDown = await submit(first, reserve("after", 4_000))
    // From the pre-loss memory (used 10) this was granted: 4 010 used + 4 000 reserved of 5 000.
    expect(whileSteppingDown.status).toBe("unavailable")

    // The step-down ends (actors dropped); the next round claims, and the user is loaded afresh.
    openGate()
    await Effect.runPromise(Fiber.join(stepDown))
    await Effect.runPromise(ownershipRound(options))
    expect(first.state.servable(partition)).toBe(true)
    expect(await submit(first, reserve("after", 4_000))).toMatchObject({
      status: "insufficient_quota",
      used: 4_010
    })

    const stored = await admin.query<{ used: string; reserved: string }>(
      `select
         (select coalesce(sum(used), 0)::text from "${database.schema}".usage_totals
           where user_id = $1 and meter = 'analysis') as used,
         (select coalesce(sum(amount - consumed), 0)::text from "${database.schema}".holds
           where user_id = $1 and meter = 'analysis' and state = 'pending') as reserved`,
      [user]
    )
    expect(stored.rows[0]).toEqual({ used: "4010", reserved: "0" })
    await lock.end()
  }, 30_000)
})
