/**
 * Postgres restarted under load (issue 34, item 4): three `serve` processes on a server of the test's
 * own (test/cluster/restartablePostgres.ts), the flow load running, the server stopped and started
 * again: fast (SIGINT, a checkpoint) or as a crash (SIGQUIT: crash recovery at the start). Every
 * session ends, every member lock with it, on the same address.
 *
 * Measured as the failover test measures (primaryFailover.ts): how long after the server answers again
 * every partition is served, the longest any partition went unserved, and how many partitions were
 * claimed from the fault on (the partition count when nothing moved between the processes). Asserted:
 * nothing lost or wrong, no process exited, every partition served again within a lease and a round of
 * the server answering.
 */
import { connect } from "@nats-io/transport-node"
import type { NatsConnection } from "@nats-io/transport-node"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { randomPrefix, stopServe } from "../support/processes.js"
import type { Member } from "./cluster.js"
import { outputs } from "./cluster.js"
import { failoverViolations, leaseMs, runFailover, servers } from "./primaryFailover.js"
import type { RestartablePostgres } from "./restartablePostgres.js"
import { restartablePostgresAvailable, startRestartablePostgres } from "./restartablePostgres.js"

/** A lease and a round (a third of a lease): the bound of any partition's unserved time after a fault. */
const servedAgainBoundMs = leaseMs + leaseMs / 3

const restarts = ["fast", "crash"] as const

describe.skipIf(!restartablePostgresAvailable()).each(restarts)(
  "cluster: Postgres restarted under load (%s)",
  (how) => {
    let server: RestartablePostgres
    let nc: NatsConnection
    const members: Array<Member> = []

    beforeAll(async () => {
      server = await startRestartablePostgres()
      nc = await connect({ servers })
    }, 120_000)

    afterAll(async () => {
      for (const member of members) await stopServe(member.serve, "SIGKILL")
      await nc?.close()
      await server?.stop()
    }, 60_000)

    it("serves every partition again within a lease and a round of the server answering, losing nothing", async () => {
      const figures = await runFailover(
        {
          nc,
          prefix: randomPrefix("pr"),
          stableUrl: server.url,
          label: "pr",
          seed: 34,
          fault: async () => {
            const faultAt = Date.now()
            await server.restart(how)
            return { faultAt, writableAt: Date.now(), note: `restarted (${how})` }
          }
        },
        members
      )
      console.log(`postgres restart (${how}): ${figures.summary}`)
      expect(failoverViolations(figures), `${figures.summary}\n${outputs(members)}`).toEqual([])
      expect(figures.load.failures, figures.summary).toBe(0)
      expect(figures.servedAgainMs, `${figures.summary}\n${outputs(members)}`).toBeLessThanOrEqual(
        servedAgainBoundMs
      )
      expect(figures.load.granted).toBeGreaterThan(50)
    }, 180_000)
  }
)

if (!restartablePostgresAvailable())
  describe("cluster: Postgres restarted under load", () => {
    it.skip("needs the Postgres 15 server binaries (/usr/lib/postgresql/15/bin)", () => {})
  })
