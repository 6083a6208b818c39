/**
 * Postgres fails over behind a stable address (issue 29, item 1): three `serve` processes reach a
 * Postgres 15 primary with a synchronous standby (test/nemesis/standby.ts) through a TCP proxy, the
 * deployment's moving address (a DNS name, a virtual IP, HAProxy). Under the flow load the proxy
 * drops every connection and refuses new ones, the primary's postmaster is killed (SIGKILL), the
 * standby is promoted, and the proxy is pointed at it: every session reset, every member lock gone, the
 * commits in flight of unknown outcome on a server that no longer exists.
 *
 * The processes ride it out without a restart: each steps down, answers `unavailable` while no primary
 * answers (/readyz says why), reconnects, and claims again at once when the promoted standby answers,
 * not at its next round: every partition is served again within 2 s of the writable primary answering
 * at the address, each claimed once, by the process that held it
 * (before issue 34: the first process back took others' partitions, then handed them on). Nothing acknowledged is lost (synchronous
 * commit), nothing over-granted, no wrong answer: the flow checks, then `used` per user as the live
 * processes and a fresh process answer it.
 */
import { connect } from "@nats-io/transport-node"
import type { NatsConnection } from "@nats-io/transport-node"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import type { StandbyPair } from "../nemesis/standby.js"
import { standbyAvailable, startStandbyPair } from "../nemesis/standby.js"
import { postgresReasons } from "../../src/ops/Readiness.js"
import { randomPrefix, stopServe } from "../support/processes.js"
import type { TcpProxy } from "../support/tcpProxy.js"
import { startTcpProxy } from "../support/tcpProxy.js"
import type { Member } from "./cluster.js"
import { outputs, sleep, withoutDecisions } from "./cluster.js"
import { failoverViolations, partitions, runFailover, servers } from "./primaryFailover.js"

/**
 * Every partition served again within 2 s of a writable primary answering at the address. Issue 29 set
 * 1 s (0.5-0.6 s measured then, 2.3-3.4 s before it); each partition's open now brings its log's tail
 * into the tables after the commits in doubt are settled and replicated (issues 34 and 36) before its
 * first load: 1.1-1.6 s on this machine (2 cores) under the flow load, most of it the claim round's and
 * the opens' first connections to the new primary (docs/SCALING.md, "After a failover").
 */
const servedAgainBoundMs = 2_000

/** How long no primary answers at the address, before the standby is promoted. */
const noPrimaryMs = 2_500

const portOf = (url: string): number => Number(new URL(url).port)

/**
 * Promoted in place (`pg_ctl promote`, as Patroni does), or a new primary freshly started (a replaced
 * instance): then the others' member locks cannot count as dead before the server has been up for the
 * grace (5 s), and each process must take its own partitions back by itself.
 */
const promotions = ["in place", "by restart"] as const

describe.skipIf(!standbyAvailable()).each(promotions)(
  "cluster: Postgres fails over behind a stable address, the standby promoted %s",
  (how) => {
    let pair: StandbyPair
    let proxy: TcpProxy
    let nc: NatsConnection
    const members: Array<Member> = []

    beforeAll(async () => {
      pair = await startStandbyPair()
      proxy = await startTcpProxy("127.0.0.1", portOf(pair.database.url))
      nc = await connect({ servers })
    }, 120_000)

    afterAll(async () => {
      for (const member of members) await stopServe(member.serve, "SIGKILL")
      await nc?.close()
      await proxy?.close()
      await pair?.database.drop()
      await pair?.stop()
    }, 60_000)

    it("serves every partition again within 2 s of the promoted standby answering, losing nothing", async () => {
      const stable = new URL(pair.database.url)
      stable.port = String(proxy.port)
      const figures = await runFailover(
        {
          nc,
          prefix: randomPrefix("pf"),
          stableUrl: stable.toString(),
          label: "pf",
          seed: 29,
          fault: async () => {
            const faultAt = Date.now()
            // The address reaches nothing; the primary is lost with whatever it had not replicated.
            await proxy.cut()
            await pair.killPrimary()
            // As long as a failover's detection takes at the least (Patroni: its loop): no primary meanwhile.
            await sleep(noPrimaryMs)
            await pair.promoteStandby(how)
            const promotedAt = Date.now()
            proxy.retarget(portOf(pair.standbyUrl))
            await proxy.restore()
            return {
              faultAt,
              writableAt: Date.now(),
              note: `standby promoted ${how} ${promotedAt - faultAt} ms after the fault`
            }
          }
        },
        members
      )
      console.log(`postgres failover, promoted ${how}: ${figures.summary}`)
      const violations = failoverViolations(figures)
      expect(violations, `${figures.summary}\n${outputs(members)}`).toEqual([])
      expect(figures.load.failures, figures.summary).toBe(0)
      // While no primary answered, /readyz said so (and why), not "ready".
      expect(
        figures.readyzSaid[postgresReasons.unreachable],
        JSON.stringify(figures.readyzSaid)
      ).toBeGreaterThan(0)
      expect(
        figures.servedAgainMs,
        `${figures.summary}\n${members.map((member) => withoutDecisions(member.serve.output())).join("\n")}`
      ).toBeLessThanOrEqual(servedAgainBoundMs)
      // Each partition claimed once, by the process that held it: none taken by the first process back
      // and handed on (issue 34, item 4: 27 claims of 16 partitions promoted in place, before).
      expect(figures.claimedAfterFault, `${figures.summary}\n${outputs(members)}`).toBe(partitions)
      // The load really ran through it, and hit the limits (over-grants had their chance).
      expect(figures.load.granted).toBeGreaterThan(50)
      expect(figures.load.refused).toBeGreaterThan(0)
    }, 180_000)
  }
)

if (!standbyAvailable())
  describe("cluster: Postgres fails over behind a stable address", () => {
    it.skip("needs the Postgres 15 server binaries (/usr/lib/postgresql/15/bin)", () => {})
  })
