/**
 * Ownership tests with member locks as `serve` holds them (src/store/postgres/memberLock.ts): an
 * advisory lock in the coordinators' namespace on a session of its own. Here the test holds it, so it
 * chooses when a lock is lost (the session ends, as every session does at a Postgres restart or
 * failover) and when, and under which key, it is taken again.
 *
 * Advisory locks belong to the database, not to a schema: test files running at once on database
 * `test` draw their keys at random, so that they never wait on each other's.
 */
import { randomInt } from "node:crypto"
import pg from "pg"
import type { OwnershipState } from "../../src/cluster/PartitionOwnership.js"
import { memberLockNamespace } from "../../src/store/postgres/ownership.js"

export interface HeldMemberLock {
  readonly key: number
  /** Ends the lock's session (Postgres releases the lock with it). */
  readonly end: () => Promise<void>
}

/** A key no other test file is likely to hold: keys are drawn as serve draws its first one. */
export const randomMemberLockKey = (): number => randomInt(1, 2 ** 31 - 1)

/** Takes `key` on a new session of `connectionString`, waiting while another session holds it. */
export const takeMemberLock = async (connectionString: string, key: number): Promise<HeldMemberLock> => {
  const client = new pg.Client({ connectionString })
  // A lock's session ended by the test or by the server: nothing to report.
  client.on("error", () => {})
  await client.connect()
  await client.query(`select pg_advisory_lock(${memberLockNamespace}, $1)`, [key])
  return { key, end: () => client.end().catch(() => undefined) }
}

export interface OwnerRow {
  readonly partition: number
  readonly owner: string
  readonly epoch: number
}

export const ownerRows = async (pool: pg.Pool, schema: string): Promise<Array<OwnerRow>> =>
  (
    await pool.query<{ partition: number; owner: string; epoch: string }>(
      `select partition, owner, epoch::text as epoch from "${schema}".partition_owners order by partition`
    )
  ).rows.map((row) => ({ partition: row.partition, owner: row.owner, epoch: Number(row.epoch) }))

/**
 * What no member may ever do: answer for a partition (servable) under an epoch its row no longer
 * carries, another member having claimed it since. Such a member answers from memory that no claim
 * backs: reads and refusals the fence cannot stop. One line per such partition and member.
 */
export const servedWithoutTheirRow = (
  rows: ReadonlyArray<OwnerRow>,
  members: ReadonlyArray<OwnershipState>
): Array<string> => {
  const byPartition = new Map(rows.map((row) => [row.partition, row]))
  const wrong: Array<string> = []
  for (const member of members)
    for (const [partition, epoch] of member.epochs) {
      const row = byPartition.get(partition)
      if (!member.servable(partition)) continue
      if (row?.owner === member.owner && row.epoch === epoch) continue
      wrong.push(
        `${member.owner} serves partition ${partition} under epoch ${epoch}; its row: ` +
          (row === undefined ? "none" : `${row.owner} epoch ${row.epoch}`)
      )
    }
  return wrong
}
