/**
 * Crash test (issue: nothing acknowledged is lost, nothing applied twice): a `serve` child process
 * under a concurrent workload is killed with SIGKILL at random moments and restarted, 20 times. After
 * each kill, Postgres must satisfy the invariant for every user and meter, hold every grant and charge
 * acknowledged before the kill, and show no idempotency key applied twice.
 */
import { connect } from "@nats-io/transport-node"
import type { NatsConnection } from "@nats-io/transport-node"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import type { ServeProcess, TestDatabase } from "../support/processes.js"
import { createTestDatabase, randomPrefix, startServe, stopServe } from "../support/processes.js"
import type { WireTarget } from "../support/wire.js"
import { requestUntilDecided } from "../support/wire.js"
import { checkDatabase } from "../support/databaseChecks.js"
import { timeUntilEveryPartitionAnswers } from "../cluster/cluster.js"

/** min / median / max of some durations. */
const summary = (values: ReadonlyArray<number>): string => {
  const sorted = [...values].sort((left, right) => left - right)
  return `${sorted[0]} / ${sorted[Math.floor(sorted.length / 2)]} / ${sorted[sorted.length - 1]} (min / median / max)`
}

const kills = 20
const users = Array.from({ length: 12 }, (_, index) => `crash-user-${index}`)
const limit = 40
const workers = 24

interface Acknowledged {
  readonly holds: Map<string, { user: string; id: string; amount: number }>
  readonly commits: Map<string, { user: string; id: string; amount: number }>
  readonly releases: Map<string, { user: string; id: string }>
  readonly adjustments: Map<string, { user: string; id: string }>
}

const snapshot = (acknowledged: Acknowledged): Acknowledged => ({
  holds: new Map(acknowledged.holds),
  commits: new Map(acknowledged.commits),
  releases: new Map(acknowledged.releases),
  adjustments: new Map(acknowledged.adjustments)
})

describe("crash: SIGKILL under load", () => {
  let database: TestDatabase
  let nc: NatsConnection
  const prefix = randomPrefix("crash")
  const partitions = 8
  let env: Record<string, string>

  beforeAll(async () => {
    database = await createTestDatabase("crash")
    nc = await connect({ servers: "127.0.0.1:4222" })
    env = {
      DATABASE_URL: database.url,
      QUOTA_PREFIX: prefix,
      QUOTA_PARTITIONS: String(partitions),
      // The default lease: a restarted process must not wait it out (its dead predecessor's lock is gone).
      QUOTA_LEASE_MS: "6000",
      LOG_LEVEL: "info"
    }
  })

  afterAll(async () => {
    await nc?.close()
    await database?.drop()
  })

  /** The process's readiness, or a failure with what it logged last (a start that hangs says why). */
  const readyOrDescribe = async (serve: ServeProcess, kill: number): Promise<void> => {
    let timer: NodeJS.Timeout | undefined
    const late = new Promise<never>((_, reject) => {
      timer = setTimeout(
        () =>
          reject(
            new Error(
              `not serving 30 s after restart ${kill}; its log ends:\n${serve.output().slice(-4_000)}`
            )
          ),
        30_000
      )
    })
    try {
      await Promise.race([serve.ready, late])
    } finally {
      clearTimeout(timer)
    }
  }

  it(`loses no acknowledged grant and applies nothing twice across ${kills} kills`, async () => {
    const target: WireTarget = { nc, prefix, partitions }
    let serve: ServeProcess = startServe(env)
    await serve.ready
    for (const user of users) {
      const { result } = await requestUntilDecided(
        target,
        { op: "set_limit", user, meter: "analysis", limit },
        { kind: "admin" }
      )
      expect(result.status).toBe("ok")
    }

    const acknowledged: Acknowledged = {
      holds: new Map(),
      commits: new Map(),
      releases: new Map(),
      adjustments: new Map()
    }
    let running = true
    let decided = 0
    const worker = async (workerIndex: number) => {
      const pending: Array<{ user: string; id: string; amount: number }> = []
      for (let sequence = 0; running; sequence += 1) {
        const user = users[(workerIndex + sequence) % users.length]!
        const choice = sequence % 5
        if ((choice === 3 || choice === 4) && pending.length > 0) {
          const hold = pending.shift()!
          if (choice === 3) {
            const amount = hold.amount - (sequence % 2)
            const { result } = await requestUntilDecided(target, {
              op: "commit",
              user: hold.user,
              id: hold.id,
              amount
            })
            if (result.status === "committed")
              acknowledged.commits.set(`${hold.user}/${hold.id}`, { ...hold, amount })
          } else {
            const { result } = await requestUntilDecided(target, {
              op: "release",
              user: hold.user,
              id: hold.id
            })
            if (result.status === "released") acknowledged.releases.set(`${hold.user}/${hold.id}`, hold)
          }
        } else if (choice === 2) {
          // A refund: usage never below 0, applied once whatever the retries.
          const id = `refund-${workerIndex}-${sequence}`
          const { result } = await requestUntilDecided(target, {
            op: "adjust",
            user,
            meter: "analysis",
            amount: -1,
            id
          })
          if (result.status === "adjusted") acknowledged.adjustments.set(`${user}/${id}`, { user, id })
        } else {
          const id = `hold-${workerIndex}-${sequence}`
          const amount = 1 + (sequence % 6)
          const { result } = await requestUntilDecided(target, {
            op: "reserve",
            user,
            meter: "analysis",
            amount,
            id
          })
          if (result.status === "reserved" || result.status === "exists") {
            acknowledged.holds.set(`${user}/${id}`, { user, id, amount })
            pending.push({ user, id, amount })
          }
        }
        decided += 1
      }
    }
    const workload = Promise.all(Array.from({ length: workers }, (_, index) => worker(index)))

    let checkedGrants = 0
    let violations = 0
    /** Per restart: ms from the kill until every partition answered again, and from the spawn until ready. */
    const backAfterKillMs: Array<number> = []
    const startupMs: Array<number> = []
    for (let kill = 1; kill <= kills; kill += 1) {
      await new Promise((resolve) => setTimeout(resolve, 300 + Math.floor((kill * 7919) % 900)))
      const killedAt = Date.now()
      serve.child.kill("SIGKILL")
      await serve.exited
      const before = snapshot(acknowledged)
      const report = await checkDatabase(database.pool, before)
      checkedGrants += report.checked
      violations += report.violations.length
      expect(report.violations, `after kill ${kill}:\n${report.violations.join("\n")}`).toEqual([])
      const spawnedAt = Date.now()
      serve = startServe(env)
      await readyOrDescribe(serve, kill)
      startupMs.push(Date.now() - spawnedAt)
      const answered = await timeUntilEveryPartitionAnswers(nc, prefix, partitions, killedAt, 20_000)
      backAfterKillMs.push(Math.max(...answered.values()))
    }
    running = false
    await workload
    const final = await checkDatabase(database.pool, snapshot(acknowledged))
    expect(final.violations).toEqual([])
    expect(await stopServe(serve)).toBe(0)
    console.log(
      `crash test: ${kills} kills, ${decided} commands decided, ${acknowledged.holds.size} holds, ` +
        `${acknowledged.commits.size} commits, ${acknowledged.releases.size} releases, ${acknowledged.adjustments.size} refunds acknowledged; ` +
        `${checkedGrants + final.checked} acknowledgements checked, ${violations} violations; ` +
        `every partition answered again after a kill in ${summary(backAfterKillMs)} ms ` +
        `(lease 6000 ms), of which starting the process (spawn to claiming its partitions) ${summary(startupMs)} ms`
    )
    expect(acknowledged.holds.size).toBeGreaterThan(kills)
  }, 240_000)
})
