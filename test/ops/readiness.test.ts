/**
 * GET /readyz follows its dependencies by itself: a real `serve` reaches Postgres and NATS through TCP
 * proxies the test cuts and restores. Readiness turns 503, naming what is down, within seconds of
 * either going away, and 200 again once it is back, with nobody touching the process.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { readinessCheckTimeoutMs } from "../../src/domain/limits.js"
import { postgresReasons } from "../../src/ops/Readiness.js"
import type { InProcessServe } from "../support/operations.js"
import { readyz, startServeInProcess, waitFor } from "../support/operations.js"
import type { TestDatabase } from "../support/processes.js"
import { createTestDatabase, randomPrefix } from "../support/processes.js"
import type { TcpProxy } from "../support/tcpProxy.js"
import { startTcpProxy } from "../support/tcpProxy.js"

/** The deadlines PROTOCOL.md's "within seconds" is held to here (the check runs every second). */
const downWithinMs = 6_000
const upWithinMs = 10_000

let database: TestDatabase
let postgresProxy: TcpProxy
let natsProxy: TcpProxy
let running: InProcessServe

beforeAll(async () => {
  database = await createTestDatabase("readiness")
  const databaseUrl = new URL(database.url)
  postgresProxy = await startTcpProxy(databaseUrl.hostname, Number(databaseUrl.port || 5432))
  databaseUrl.host = `127.0.0.1:${postgresProxy.port}`
  natsProxy = await startTcpProxy("127.0.0.1", 4222)
  running = await startServeInProcess({
    DATABASE_URL: databaseUrl.toString(),
    NATS_URL: `nats://127.0.0.1:${natsProxy.port}`,
    QUOTA_PREFIX: randomPrefix("ready"),
    QUOTA_LEASE_MS: "3000"
  })
})

afterAll(async () => {
  await running?.stop()
  await postgresProxy?.close()
  await natsProxy?.close()
  await database?.drop()
})

const until = (status: number, withinMs: number) =>
  waitFor(
    async () => {
      const answer = await readyz(running.httpPort)
      return answer.status === status ? answer : undefined
    },
    withinMs,
    async () => `/readyz still answers ${JSON.stringify(await readyz(running.httpPort).catch(String))}`
  )

describe("GET /readyz", () => {
  it("is 200 once connected to NATS and Postgres answers", async () => {
    const ready = await until(200, upWithinMs)
    expect(ready.body).toEqual({ status: "ready" })
  })

  it("turns 503 naming postgres when Postgres goes away, and 200 again when it is back", async () => {
    await until(200, upWithinMs)
    const cutAt = Date.now()
    await postgresProxy.cut()
    const down = await until(503, downWithinMs)
    const tookMs = Date.now() - cutAt
    expect(down.body).toMatchObject({ status: "not_ready", down: ["postgres"] })
    // Fixed words only: Postgres's own text (hosts, ports, database and user names) stays in the log.
    expect([postgresReasons.unreachable, postgresReasons.timedOut(readinessCheckTimeoutMs)]).toContain(
      (down.body["reasons"] as Record<string, unknown>)["postgres"]
    )
    expect(JSON.stringify(down.body)).not.toContain(String(postgresProxy.port))
    await postgresProxy.restore()
    const upAgain = await until(200, upWithinMs)
    expect(upAgain.body).toEqual({ status: "ready" })
    console.log(`readyz: 503 ${tookMs} ms after Postgres went away`)
  })

  it("turns 503 naming nats when NATS goes away, and 200 again when it is back", async () => {
    await until(200, upWithinMs)
    await natsProxy.cut()
    const down = await until(503, downWithinMs)
    expect(down.body).toMatchObject({ status: "not_ready", down: ["nats"] })
    await natsProxy.restore()
    const upAgain = await until(200, upWithinMs)
    expect(upAgain.body).toEqual({ status: "ready" })
  })

  it("/healthz stays 200 through both outages: the process itself is fine", async () => {
    const health = await fetch(`http://127.0.0.1:${running.httpPort}/healthz`)
    expect(health.status).toBe(200)
  })
})
