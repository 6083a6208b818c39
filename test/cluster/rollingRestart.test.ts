/**
 * Rolling restart (scaling out): three `serve` processes under a concurrent load through the SDK are
 * restarted one at a time: SIGTERM, wait for exit 0, start a new one, wait until the three share the
 * partitions again. A graceful leave hands every partition off (stop taking messages, answer those in
 * flight, release the leases), so no caller may see anything but decided results: every SDK call
 * resolves (the client's retries cover the hand-off), nothing acknowledged is lost, nothing over-granted.
 */
import { connect } from "@nats-io/transport-node"
import type { NatsConnection } from "@nats-io/transport-node"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { checkDatabase } from "../support/databaseChecks.js"
import type { TestDatabase } from "../support/processes.js"
import { createTestDatabase, randomPrefix, startServe, stopServe } from "../support/processes.js"
import type { Member } from "./cluster.js"
import {
  Load,
  clientOverGrants,
  databaseAgainstClients,
  describeFailures,
  logEntries,
  outputs,
  ownerOf,
  ownerRows,
  probePartitions,
  sleep,
  startCluster,
  waitForBalance,
  withoutDecisions
} from "./cluster.js"

const partitions = 16
const leaseMs = 1_500
const servers = "127.0.0.1:4222"

/** Probes every partition every 100 ms; per partition, the longest stretch without an `ok`. */
const watchPartitions = (nc: NatsConnection, prefix: string) => {
  const lastOk = new Map<number, number>()
  const longestGap = new Map<number, number>()
  let running = true
  const started = Date.now()
  const loop = (async () => {
    while (running) {
      const roundStarted = Date.now()
      const answered = await probePartitions(nc, prefix, partitions, 500)
      for (let partition = 0; partition < partitions; partition += 1) {
        const previous = lastOk.get(partition) ?? started
        if (answered.has(partition)) {
          longestGap.set(partition, Math.max(longestGap.get(partition) ?? 0, roundStarted - previous))
          lastOk.set(partition, roundStarted)
        }
      }
      await sleep(Math.max(0, 100 - (Date.now() - roundStarted)))
    }
  })()
  return {
    stop: async () => {
      running = false
      await loop
      return longestGap
    }
  }
}

describe("cluster: rolling restart of every process under load", () => {
  let database: TestDatabase
  let nc: NatsConnection
  let members: Array<Member> = []
  const prefix = randomPrefix("rr")

  beforeAll(async () => {
    database = await createTestDatabase("rolling")
    nc = await connect({ servers })
  })

  afterAll(async () => {
    for (const member of members) await stopServe(member.serve, "SIGKILL")
    await nc?.close()
    await database?.drop()
  })

  it("restarts all three one at a time; every call resolves decided, nothing lost", async () => {
    const env = {
      DATABASE_URL: database.url,
      QUOTA_PREFIX: prefix,
      QUOTA_PARTITIONS: String(partitions),
      QUOTA_LEASE_MS: String(leaseMs)
    }
    members = await startCluster(env, database.pool, partitions, 3)
    const everyone = [...members]
    const load = await Load.start({
      servers,
      prefix,
      partitions,
      label: "rr",
      workers: 32,
      usersPerPartition: 3,
      limit: 12,
      amountMax: 3,
      seed: 4,
      // Generous for a hand-off: ~60 attempts 25..250 ms apart, 2 s per attempt.
      client: { timeoutMs: 2_000, retry: { attemptsMax: 60, baseDelayMs: 25, delayMsMax: 250 } }
    })
    const loadStarted = Date.now()
    const watch = watchPartitions(nc, prefix)
    await sleep(2_000)

    const restarts: Array<string> = []
    const leftovers: Array<string> = []
    const claimsWhileLeaving: Array<string> = []
    const exitCodes: Array<number | null> = []
    for (let index = 0; index < members.length; index += 1) {
      const old = members[index]!
      const stoppingAt = Date.now()
      const code = await stopServe(old.serve, "SIGTERM")
      exitCodes.push(code)
      const exitedAt = Date.now()
      // A graceful leave released every lease it held: nobody has to wait one out.
      const kept = (await ownerRows(database.pool)).filter((row) => row.owner === old.owner && row.live)
      if (kept.length > 0)
        leftovers.push(
          `${old.owner} exited holding live leases on ${kept.map((row) => row.partition).join(", ")}`
        )
      // Nothing claimed once SIGTERM arrived: a claim while leaving holds a lease nobody renews.
      for (const entry of logEntries(old.serve)) {
        if (entry.msg === "claimed partitions" && entry.time >= stoppingAt)
          claimsWhileLeaving.push(`${old.owner} claimed ${JSON.stringify(entry["partitions"])} while leaving`)
      }

      const serve = startServe(env)
      await Promise.race([
        serve.ready,
        serve.exited.then((exit) => {
          throw new Error(`restarted serve exited with ${exit}:\n${serve.output()}`)
        })
      ])
      members[index] = { serve, owner: ownerOf(serve) }
      everyone.push(members[index]!)
      await waitForBalance(
        database.pool,
        partitions,
        members.map((member) => member.owner),
        20_000,
        () => outputs(members)
      )
      restarts.push(
        `#${index + 1}: exit ${code} after ${exitedAt - stoppingAt} ms, balanced again ${Date.now() - stoppingAt} ms after SIGTERM`
      )
      await sleep(1_000)
    }
    await sleep(2_000)
    const report = await load.stop()
    const gaps = await watch.stop()

    const database_ = await checkDatabase(database.pool, load.snapshot())
    const overGrants = clientOverGrants(load)
    const mismatches = await databaseAgainstClients(database.pool, load)
    const longestGap = Math.max(...gaps.values())
    const summary =
      `rolling restart: ${restarts.join("; ")}; longest stretch a partition did not answer a probe: ` +
      `${longestGap} ms. Load: ${report.cycles} cycles, ${report.granted} grants, ${report.refused} refusals ` +
      `(limit hit), ${report.users} users, ${report.retries} retries, ${report.failures.length} failed calls, ` +
      `longest call ${report.longestCallMs} ms; ${database_.checked} acknowledgements checked; violations: ` +
      `${overGrants.length} over-grants seen by clients, ${database_.violations.length} from checkDatabase, ` +
      `${mismatches.length} Postgres vs clients; leases left behind: ${leftovers.length}; claims while leaving: ${claimsWhileLeaving.length}`
    console.log(summary)

    expect(exitCodes).toEqual([0, 0, 0])
    expect(
      report.failures,
      `${summary}\n${describeFailures(report.failures, loadStarted)}\nload started at ${loadStarted}\n${outputs(everyone)}`
    ).toEqual([])
    expect(overGrants, summary).toEqual([])
    expect(database_.violations, summary).toEqual([])
    expect(mismatches, summary).toEqual([])
    expect(leftovers, summary).toEqual([])
    expect(claimsWhileLeaving, summary).toEqual([])
    expect(report.granted).toBeGreaterThan(200)
    expect(report.refused).toBeGreaterThan(50)

    for (const member of members) {
      expect(await stopServe(member.serve), withoutDecisions(member.serve.output())).toBe(0)
    }
    members = []
  }, 150_000)
})
