/**
 * Failover (scaling out): three `serve` processes share 16 partitions; under a concurrent load through
 * the SDK one of them is killed with SIGKILL. Its death is known at once (its advisory lock went with
 * its connection), so its partitions must be served again well within the lease (measured: from the
 * kill until every partition answers a probe `get_usage`; the default 6 s lease here, so waiting it
 * out would fail), every client call must complete through the SDK's retries, and Postgres must
 * afterwards satisfy the invariant and hold every acknowledged grant.
 *
 * Issue 22: a probe about fresh users watches every partition from before the kill to the end, and the
 * longest time any partition went unserved as a client sees it is printed, for the dead process's
 * partitions and for the survivors' (which a fair share that moved them would leave unserved too).
 */
import { connect } from "@nats-io/transport-node"
import type { NatsConnection } from "@nats-io/transport-node"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { checkDatabase } from "../support/databaseChecks.js"
import type { TestDatabase } from "../support/processes.js"
import { createTestDatabase, randomPrefix, stopServe } from "../support/processes.js"
import type { Gap, Member } from "./cluster.js"
import {
  Load,
  clientOverGrants,
  databaseAgainstClients,
  describeFailures,
  logEntries,
  longestGaps,
  outputs,
  ownerRows,
  sleep,
  startCluster,
  timeUntilEveryPartitionAnswers,
  watchPartitions
} from "./cluster.js"

const partitions = 16
const leaseMs = 6_000
/** Well within the lease: the goal is 1 s; the bound leaves room for a loaded machine. */
const failoverBoundMs = 2_000
const servers = "127.0.0.1:4222"
/** Issue 22: with one of three killed, no partition unserved for more than 1 s as a client sees it. */
const unservedBoundMs = 1_000

describe("cluster: SIGKILL of one of three processes under load", () => {
  let database: TestDatabase
  let nc: NatsConnection
  let members: Array<Member> = []
  const prefix = randomPrefix("fo")

  beforeAll(async () => {
    database = await createTestDatabase("failover")
    nc = await connect({ servers })
  })

  afterAll(async () => {
    for (const member of members) await stopServe(member.serve, "SIGKILL")
    await nc?.close()
    await database?.drop()
  })

  it("serves the killed process's partitions again well within the lease, losing nothing", async () => {
    const env = {
      DATABASE_URL: database.url,
      QUOTA_PREFIX: prefix,
      QUOTA_PARTITIONS: String(partitions),
      QUOTA_LEASE_MS: String(leaseMs)
    }
    members = await startCluster(env, database.pool, partitions, 3)

    const load = await Load.start({
      servers,
      prefix,
      partitions,
      label: "fo",
      workers: 32,
      usersPerPartition: 3,
      limit: 12,
      amountMax: 3,
      seed: 1,
      // Generous enough for a failover: attempts every 25..250 ms, 1 s per attempt, for ~40 attempts.
      client: { timeoutMs: 1_000, retry: { attemptsMax: 40, baseDelayMs: 25, delayMsMax: 250 } }
    })
    const loadStarted = Date.now()
    const watch = watchPartitions(nc, prefix, partitions)
    await sleep(3_000)

    const victim = members[0]!
    const before = await ownerRows(database.pool)
    const victimPartitions = before.filter((row) => row.owner === victim.owner).map((row) => row.partition)
    expect(victimPartitions.length).toBeGreaterThan(0)

    const killedAt = Date.now()
    victim.serve.child.kill("SIGKILL")
    await victim.serve.exited
    const firstOk = await timeUntilEveryPartitionAnswers(nc, prefix, partitions, killedAt, 20_000)
    const failoverMs = Math.max(...firstOk.values())
    const perPartition = victimPartitions.map((partition) => `${partition}: ${firstOk.get(partition)} ms`)

    // Keep the load on the new owners for a while, then let every call finish.
    await sleep(3_000)
    const report = await load.stop()
    const stoppedAt = Date.now()
    const oks = await watch.stop()
    const after = await ownerRows(database.pool)
    const gaps = longestGaps(oks, killedAt, stoppedAt)
    const worst = (of: ReadonlyArray<Gap>) =>
      of.reduce((left, right) => (right.ms > left.ms ? right : left), {
        partition: -1,
        from: 0,
        to: 0,
        ms: 0
      })
    const describeGap = (gap: Gap) =>
      `${gap.ms} ms (partition ${gap.partition}, +${gap.from - killedAt} to +${gap.to - killedAt} ms after the kill)`
    const deadOnes = gaps.filter((gap) => victimPartitions.includes(gap.partition))
    const survivorsOnes = gaps.filter((gap) => !victimPartitions.includes(gap.partition))
    const longestUnserved = worst(gaps)
    // When the survivors claimed the dead process's partitions, by their logs.
    const claims = members
      .slice(1)
      .flatMap((member) => logEntries(member.serve))
      .filter((entry) => entry.msg === "claimed partitions" && entry.time >= killedAt)
      .map((entry) => `+${entry.time - killedAt} ms ${JSON.stringify(entry["partitions"])}`)
    const moved = before.filter((row) => {
      const now = after.find((candidate) => candidate.partition === row.partition)
      return row.owner !== victim.owner && now !== undefined && now.owner !== row.owner
    })

    const survivors = members.slice(1).map((member) => member.owner)
    const database_ = await checkDatabase(database.pool, load.snapshot())
    const overGrants = clientOverGrants(load)
    const mismatches = await databaseAgainstClients(database.pool, load)

    console.log(
      `failover: killed ${victim.owner} owning partitions ${victimPartitions.join(", ")}; every partition ` +
        `answered again ${failoverMs} ms after the kill (lease ${leaseMs} ms; per partition: ${perPartition.join(", ")}). ` +
        `Load: ${report.cycles} cycles, ${report.granted} grants, ${report.refused} refusals ` +
        `(limit hit), ${report.users} users, ${report.retries} retries, longest call ${report.longestCallMs} ms; ` +
        `${database_.checked} acknowledgements checked, ${database_.violations.length + overGrants.length + mismatches.length} violations`
    )
    console.log(
      `failover gaps (fresh-user probe every 100 ms, from the kill to ${stoppedAt - killedAt} ms after): ` +
        `longest a partition went unserved ${describeGap(longestUnserved)}; of the dead process's partitions ` +
        `${describeGap(worst(deadOnes))}; of the survivors' ${describeGap(worst(survivorsOnes))}; ` +
        `survivors' partitions that changed owner: ${moved.length}` +
        (moved.length === 0 ? "" : ` (${moved.map((row) => row.partition).join(", ")})`) +
        `; the survivors' claims after the kill: ${claims.join(", ")}` +
        `; per partition: ${gaps.map((gap) => `${gap.partition}: ${gap.ms}`).join(", ")} ms`
    )

    expect(
      report.failures,
      `${describeFailures(report.failures, loadStarted)}\nload started at ${loadStarted}, kill at ${killedAt}\n${outputs(members)}`
    ).toEqual([])
    expect(database_.violations).toEqual([])
    expect(overGrants).toEqual([])
    expect(mismatches).toEqual([])
    expect(failoverMs, `every partition answered again ${failoverMs} ms after the kill`).toBeLessThanOrEqual(
      failoverBoundMs
    )
    // Issue 22: only the dead process's partitions move, and no partition goes unserved for more than
    // 1 s as a client sees it (a probe with a 500 ms timeout every 100 ms).
    expect(
      moved.map((row) => row.partition),
      "survivors' partitions that changed owner"
    ).toEqual([])
    expect(longestUnserved.ms, `longest unserved ${describeGap(longestUnserved)}`).toBeLessThanOrEqual(
      unservedBoundMs
    )
    // The survivors own every partition, and the dead process nothing.
    expect(
      after.every((row) => row.live && survivors.includes(row.owner)),
      JSON.stringify(after)
    ).toBe(true)
    // The load really ran through the failover and really hit the limit.
    expect(report.granted).toBeGreaterThan(200)
    expect(report.refused).toBeGreaterThan(50)

    for (const member of members.slice(1)) {
      expect(await stopServe(member.serve), outputs([member])).toBe(0)
    }
  }, 120_000)
})
