/**
 * Three `serve` processes started at the same moment, many times (issue 26 item 0): every partition
 * must be held, 3, 3 and 2 of 8, within a few rounds of the last one serving. Tried from outside, 3
 * starts of 49 left a partition that nobody ever claimed (the processes held 3, 2 and 2 and each
 * claim of the short one reached only for rows the others held); here, before the fix, 1 start of 24
 * (held 3, 3 and 0, two partitions without a row). Rare with real processes, so the store-level test
 * (test/store/ownershipUnclaimed.test.ts, 60 starts of concurrent rounds) is the one that fails
 * every time without the fix; this one checks the deployed build end to end. The schema is dropped between
 * starts: each start is on a fresh database.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import type { ServeProcess, TestDatabase } from "../support/processes.js"
import { createTestDatabase, randomPrefix, startServe, stopServe } from "../support/processes.js"
import type { Member } from "./cluster.js"
import { ownerOf, ownerRows, sleep } from "./cluster.js"

const partitions = 8
const leaseMs = 1_500
const starts = 12
/** Rounds run every lease/3 (500 ms): several rounds, far short of "never". */
const balancedWithinMs = 5_000

/** The processes hold every partition, 3, 3 and 2 of 8; the rows as they stand otherwise. */
const balancedAt = async (database: TestDatabase, owners: ReadonlyArray<string>) => {
  const rows = await ownerRows(database.pool)
  const counts = owners.map((owner) => rows.filter((row) => row.live && row.owner === owner).length)
  const held = new Set(rows.filter((row) => row.live).map((row) => row.partition))
  const free = Array.from({ length: partitions }, (_, partition) => partition).filter(
    (partition) => !held.has(partition)
  )
  const balanced = free.length === 0 && counts.sort().join() === "2,3,3"
  return { balanced, summary: `held ${counts.join(", ")}, free (no row or no lease) [${free.join(", ")}]` }
}

describe("cluster: three processes started at once", () => {
  let database: TestDatabase
  let running: Array<ServeProcess> = []
  const prefix = randomPrefix("sa")

  beforeAll(async () => {
    database = await createTestDatabase("startatonce")
  })

  afterAll(async () => {
    for (const serve of running) await stopServe(serve, "SIGKILL")
    await database?.drop()
  })

  it(`hold every partition within a few rounds, ${starts} starts`, async () => {
    const env = {
      DATABASE_URL: database.url,
      QUOTA_PREFIX: prefix,
      QUOTA_PARTITIONS: String(partitions),
      QUOTA_LEASE_MS: String(leaseMs)
    }
    const unbalanced: Array<string> = []
    const balancedAfterMs: Array<number> = []
    for (let start = 0; start < starts; start += 1) {
      // A fresh database: the three race on its migration, which lines their first rounds up.
      await database.pool.query("drop schema if exists quota cascade")
      running = [0, 1, 2].map(() => startServe(env, "serving"))
      await Promise.all(
        running.map((serve) =>
          Promise.race([
            serve.ready,
            serve.exited.then((code) => {
              throw new Error(`serve exited with ${code} before serving:\n${serve.output()}`)
            })
          ])
        )
      )
      const members: Array<Member> = running.map((serve) => ({ serve, owner: ownerOf(serve) }))
      const servingAt = Date.now()
      let state = await balancedAt(
        database,
        members.map((member) => member.owner)
      )
      while (!state.balanced && Date.now() - servingAt < balancedWithinMs) {
        await sleep(50)
        state = await balancedAt(
          database,
          members.map((member) => member.owner)
        )
      }
      if (state.balanced) balancedAfterMs.push(Date.now() - servingAt)
      else unbalanced.push(`start ${start}: ${state.summary} ${balancedWithinMs} ms after all served`)
      // Killed, not stopped: the next start drops the schema anyway, and a leave takes a second more.
      await Promise.all(running.map((serve) => stopServe(serve, "SIGKILL")))
      running = []
    }
    balancedAfterMs.sort((left, right) => left - right)
    console.log(
      `${starts} starts of three processes at once, ${partitions} partitions, lease ${leaseMs} ms: ` +
        `${unbalanced.length} not balanced within ${balancedWithinMs} ms` +
        (unbalanced.length > 0 ? ` (${unbalanced.join("; ")})` : "") +
        `; balanced after (ms): ${balancedAfterMs.join(", ")}`
    )
    expect(unbalanced).toEqual([])
  })
})
