/**
 * Member locks across a standby promoted in place (issue 34, item 3). A failover ends every member
 * lock's session; on the promoted server nobody holds any lock until each member has taken its own
 * again. A member whose lock is not taken again yet must not look dead there: before, a missing lock
 * counted as a death once the server had been up for 5 s (`pg_postmaster_start_time()`), and a standby
 * promoted in place keeps the start time it had as a standby (the review measured 7 683 ms at the
 * moment it became writable). So the first member to lock again took every other member's partitions,
 * whatever their leases, and the others got them back only through a wave of hand-offs.
 *
 * A lock counts only on the server where it was taken (its start and its timeline, which a promotion
 * changes): until a member has locked again on the promoted server, its lease and heartbeat speak for
 * it. Once it has, losing the lock there is a death, seen at once as before.
 */
import { Effect } from "effect"
import pg from "pg"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import type { OwnershipOptions, OwnershipState } from "../../src/cluster/PartitionOwnership.js"
import { makeOwnershipState, memberLockLost, ownershipRound } from "../../src/cluster/PartitionOwnership.js"
import { migrate } from "../../src/store/postgres/migrate.js"
import type { OwnershipQueries } from "../../src/store/postgres/ownership.js"
import { makeOwnershipQueries } from "../../src/store/postgres/ownership.js"
import type { StandbyPair } from "../nemesis/standby.js"
import { standbyAvailable, startStandbyPair } from "../nemesis/standby.js"
import { randomSchemaName } from "../support/database.js"
import { sleep } from "../support/operations.js"
import type { HeldMemberLock } from "../support/ownershipMembers.js"
import { ownerRows, randomMemberLockKey, takeMemberLock } from "../support/ownershipMembers.js"

const schema = randomSchemaName("promotion")
const partitions = 4
const leaseMs = 60_000
/** The grace the old rule gave a server after its start; the standby is made older than this. */
const oldGraceMs = 5_000

interface Member {
  readonly state: OwnershipState
  readonly key: number
  lock: HeldMemberLock | undefined
}

const member = (owner: string): Member => ({
  state: makeOwnershipState(owner),
  key: randomMemberLockKey(),
  lock: undefined
})

const optionsOf = (each: Member, queries: OwnershipQueries): OwnershipOptions => ({
  state: each.state,
  queries,
  partitions,
  leaseMs,
  renewIntervalMs: leaseMs / 3,
  lockKey: () => each.lock?.key ?? null,
  serve: () => Effect.void,
  stop: () => Effect.void,
  log: () => {}
})

/** Takes the member's lock (its one key: a process keeps it across losses) on the server at `url`. */
const lock = async (each: Member, url: string) => {
  each.lock = await takeMemberLock(url, each.key)
  each.state.memberLockHeld = true
}

const pools: Array<pg.Pool> = []
const poolAt = (url: string): pg.Pool => {
  const pool = new pg.Pool({ connectionString: url, max: 4 })
  pool.on("error", () => {})
  pools.push(pool)
  return pool
}

let pair: StandbyPair

beforeAll(async () => {
  if (standbyAvailable()) pair = await startStandbyPair()
}, 120_000)

afterAll(async () => {
  await Promise.all(pools.map((pool) => pool.end().catch(() => undefined)))
  await pair?.database.drop()
  await pair?.stop()
}, 60_000)

describe.skipIf(!standbyAvailable())("member locks when a standby is promoted in place", () => {
  it("no member looks dead before it could lock again; one that lost its lock on the promoted server is dead at once", async () => {
    const primary = poolAt(pair.database.url)
    await Effect.runPromise(migrate(primary, schema))
    const before = makeOwnershipQueries(primary, schema)
    const [a, b] = [member("member-a"), member("member-b")] as [Member, Member]
    await lock(a, pair.database.url)
    await lock(b, pair.database.url)
    for (const each of [a, b, a, b]) await Effect.runPromise(ownershipRound(optionsOf(each, before)))
    const heldByA = [...a.state.epochs.keys()].sort()
    const heldByB = [...b.state.epochs.keys()].sort()
    expect([heldByA.length, heldByB.length]).toEqual([2, 2])

    // The standby has been up for longer than the old grace when it is promoted.
    const standby = poolAt(pair.standbyUrl)
    const upMs = async () =>
      Number(
        (
          await standby.query<{ up_ms: string }>(
            "select (extract(epoch from clock_timestamp() - pg_postmaster_start_time()) * 1000)::bigint as up_ms"
          )
        ).rows[0]!.up_ms
      )
    while ((await upMs()) < oldGraceMs + 500) await sleep(200)

    await pair.killPrimary()
    await pair.promoteStandby("in place")
    const upWhenWritable = await upMs()
    for (const each of [a, b]) {
      await each.lock!.end()
      await Effect.runPromise(memberLockLost(optionsOf(each, before), "failover"))
    }

    // B locks again on the promoted server first and runs its round; A has not locked again yet.
    const after = makeOwnershipQueries(poolAt(pair.standbyUrl), schema)
    await lock(b, pair.standbyUrl)
    await Effect.runPromise(ownershipRound(optionsOf(b, after)))
    const rowsAfterB = await ownerRows(standby, schema)
    console.log(
      `promoted in place, up ${upWhenWritable} ms when it became writable (the old grace: ${oldGraceMs} ms); ` +
        `after B's first round there: ${rowsAfterB.map((row) => `${row.partition}:${row.owner}`).join(" ")}, ` +
        `B holds [${[...b.state.epochs.keys()].sort().join(", ")}], A held [${heldByA.join(", ")}]`
    )
    expect([...b.state.epochs.keys()].sort()).toEqual(heldByB)
    expect(rowsAfterB.filter((row) => heldByA.includes(row.partition)).map((row) => row.owner)).toEqual([
      "member-a",
      "member-a"
    ])

    // A locks again there and takes its own partitions back: nothing moved between the two.
    await lock(a, pair.standbyUrl)
    await Effect.runPromise(ownershipRound(optionsOf(a, after)))
    expect([...a.state.epochs.keys()].sort()).toEqual(heldByA)

    // A's lock, taken on the promoted server, is lost there: A is dead, its partitions B's at once.
    await a.lock!.end()
    const aGone = performance.now()
    while (performance.now() - aGone < 5_000) {
      await Effect.runPromise(ownershipRound(optionsOf(b, after)))
      if (b.state.epochs.size === partitions) break
      await sleep(100)
    }
    expect([...b.state.epochs.keys()].sort()).toEqual([0, 1, 2, 3])
  }, 120_000)
})
