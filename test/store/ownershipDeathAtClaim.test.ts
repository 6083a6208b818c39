/**
 * A member is judged dead when a claim takes its rows, not earlier in the claimer's round (issue 34,
 * item 3). Two processes with the real Postgres store and fence, each with its member lock. A failover
 * ends both locks' sessions; both step down and lock again. B's round reads the members while A has
 * not locked again yet, and is slowed before its claim (a pause, a slow renewal: anything between the
 * two). Meanwhile A locks again, under a new key (as when its old key is still held), heartbeats,
 * claims its rows back and serves them. When B's claim then runs, A is alive: it must take nothing of
 * A's. Before, the claim took every row of the owners on a dead list read at the start of the round:
 * A, still serving from the memory of its fresh claim, answered `commit` of a hold B had granted
 * `not_found`, and `get_usage` reserved 20 where B knew 40.
 */
import { Context, Effect, Layer } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import type { CoordinatorShape } from "../../src/actors/Coordinator.js"
import { Coordinator, coordinatorLayer } from "../../src/actors/Coordinator.js"
import type { OwnershipOptions, OwnershipState } from "../../src/cluster/PartitionOwnership.js"
import { makeOwnershipState, memberLockLost, ownershipRound } from "../../src/cluster/PartitionOwnership.js"
import type { Command } from "../../src/domain/commands.js"
import { defaultConfig } from "../../src/domain/config.js"
import { partitionOf } from "../../src/domain/partition.js"
import type { Result } from "../../src/domain/results.js"
import type { OwnershipQueries } from "../../src/store/postgres/ownership.js"
import { makeOwnershipQueries } from "../../src/store/postgres/ownership.js"
import { postgresStoreLayer } from "../../src/store/postgres/PostgresStore.js"
import { commitCommand, reserveCommand } from "../support/commands.js"
import { acquireScoped, createTestSchema } from "../support/database.js"
import type { HeldMemberLock } from "../support/ownershipMembers.js"
import {
  ownerRows,
  randomMemberLockKey,
  servedWithoutTheirRow,
  takeMemberLock
} from "../support/ownershipMembers.js"

const database = createTestSchema("death_at_claim")
const admin = database.pool({ max: 4 })
const partitions = 4
const leaseMs = 60_000

interface Member {
  readonly state: OwnershipState
  readonly coordinator: CoordinatorShape
  readonly close: () => Promise<void>
  lock: HeldMemberLock | undefined
}

/** A coordinator over the Postgres store, fenced and served by `owner`'s ownership state. */
const startMember = async (owner: string): Promise<Member> => {
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
        prefix: "death-at-claim",
        partitions,
        fence: state.fence
      })
    )
  )
  const opened = await acquireScoped(
    Effect.map(Layer.build(layer), (context) => Context.get(context, Coordinator))
  )
  return { state, coordinator: opened.value, close: opened.close, lock: undefined }
}

const lock = async (member: Member): Promise<void> => {
  member.lock = await takeMemberLock(database.connectionString, randomMemberLockKey())
  member.state.memberLockHeld = true
}

const ownershipOf = (member: Member, queries: OwnershipQueries): OwnershipOptions => ({
  state: member.state,
  queries,
  partitions,
  leaseMs,
  renewIntervalMs: leaseMs / 3,
  lockKey: () => member.lock?.key ?? null,
  serve: () => Effect.void,
  stop: (stopped) => member.coordinator.dropPartitions(stopped),
  log: () => {}
})

const submit = (member: Member, command: Command): Promise<Result> =>
  Effect.runPromise(member.coordinator.submit(command))

let a: Member
let b: Member

beforeAll(async () => {
  a = await startMember("member-a")
  b = await startMember("member-b")
})

afterAll(async () => {
  await a?.lock?.end()
  await b?.lock?.end()
  await a?.close()
  await b?.close()
  await database.drop()
})

describe("a claim of another member's rows", () => {
  it("takes nothing from a member that locked again and claimed its rows back during the claimer's round", async () => {
    const queries = makeOwnershipQueries(admin, database.schema)
    await lock(a)
    await lock(b)
    for (const member of [a, b, a]) await Effect.runPromise(ownershipRound(ownershipOf(member, queries)))
    const heldByA = [...a.state.epochs.keys()]
    expect(heldByA.length).toBe(2)
    let user = ""
    for (let index = 0; partitionOf(user, partitions) !== heldByA[0]; index += 1) user = `user-${index}`
    expect(await submit(a, reserveCommand(user, "before", 10))).toMatchObject({ status: "reserved" })

    // A failover: both locks' sessions end; each process steps down from all and locks again.
    await a.lock!.end()
    await b.lock!.end()
    await Effect.runPromise(memberLockLost(ownershipOf(a, queries), "failover"))
    await Effect.runPromise(memberLockLost(ownershipOf(b, queries), "failover"))
    await lock(b)

    // B's round reads the members (A's row still names its old key, which nobody holds), then waits.
    let letBOn = (): void => {}
    const bMayGoOn = new Promise<void>((resolve) => (letBOn = resolve))
    let bWaits = (): void => {}
    const bWaiting = new Promise<void>((resolve) => (bWaits = resolve))
    const slowed: OwnershipQueries = {
      ...queries,
      renew: (owner, held, lease) =>
        Effect.andThen(
          Effect.promise(async () => {
            bWaits()
            await bMayGoOn
          }),
          queries.renew(owner, held, lease)
        )
    }
    const bRound = Effect.runPromise(ownershipRound(ownershipOf(b, slowed)))
    await bWaiting

    // A locks again under a new key, heartbeats, claims its rows back and serves them.
    await lock(a)
    await Effect.runPromise(ownershipRound(ownershipOf(a, queries)))
    expect(heldByA.map((partition) => a.state.servable(partition))).toEqual([true, true])
    expect(await submit(a, reserveCommand(user, "after", 10))).toMatchObject({ status: "reserved" })

    letBOn()
    await bRound
    const rows = await ownerRows(admin, database.schema)
    const wrong = servedWithoutTheirRow(rows, [a.state, b.state])
    console.log(
      `after B's claim: rows ${rows.map((row) => `${row.partition}:${row.owner}@${row.epoch}`).join(" ")}; ` +
        `A serves ${[...a.state.epochs].map(([p, e]) => `${p}@${e}`).join(" ")}, ` +
        `B serves ${[...b.state.epochs].map(([p, e]) => `${p}@${e}`).join(" ")}; ` +
        `served without their row: ${wrong.length === 0 ? "none" : wrong.join("; ")}`
    )
    expect(wrong).toEqual([])
    expect(rows.filter((row) => heldByA.includes(row.partition)).map((row) => row.owner)).toEqual([
      "member-a",
      "member-a"
    ])

    // The user's partition is A's alone: B answers nothing for it, A answers from what is stored.
    expect(await submit(b, reserveCommand(user, "via-b", 20))).toMatchObject({ status: "unavailable" })
    expect(await submit(a, commitCommand(user, "after"))).toMatchObject({ status: "committed", used: 10 })
    const usage = await submit(a, { op: "get_usage", user })
    expect(usage).toMatchObject({
      status: "ok",
      meters: expect.arrayContaining([expect.objectContaining({ meter: "analysis", used: 10, reserved: 10 })])
    })
  }, 30_000)
})
