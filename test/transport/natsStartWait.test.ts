/**
 * A coordinator started while NATS cannot be reached (restarted by its supervisor during an outage, or
 * started before NATS) waits for it, as a running one rides an outage out: found by the nemesis, where
 * a process killed and started again while its NATS path refused connections exited 1 ("cannot connect
 * to NATS ... connection refused"). Credentials and TLS failures still end the start at once
 * (test/security). Past the wait, the start fails with the last reason.
 */
import { afterAll, describe, expect, it } from "vitest"
import type { TcpProxy } from "../support/tcpProxy.js"
import { startTcpProxy } from "../support/tcpProxy.js"
import type { Harness } from "./support.js"
import { startHarness } from "./support.js"

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms))

describe("serve's start while NATS refuses connections", () => {
  const proxies: Array<TcpProxy> = []
  const harnesses: Array<Harness> = []

  afterAll(async () => {
    for (const harness of harnesses) await harness.close()
    for (const proxy of proxies) await proxy.close()
  })

  it("waits for NATS and serves once it answers", async () => {
    const proxy = await startTcpProxy("127.0.0.1", 4222)
    proxies.push(proxy)
    await proxy.cut()
    const starting = startHarness({
      label: "startwait",
      server: { servers: `nats://127.0.0.1:${proxy.port}`, startWaitMs: 20_000 }
    })
    const outcome = starting.then(
      (harness) => ({ harness, at: Date.now() }),
      (error: unknown) => ({ error, at: Date.now() })
    )
    await sleep(3_000)
    const restoredAt = Date.now()
    await proxy.restore()
    const started = await outcome
    expect("error" in started ? String(started.error) : "started").toBe("started")
    if (!("harness" in started)) return
    harnesses.push(started.harness)
    console.log(`started ${started.at - restoredAt} ms after NATS answered`)
    expect(started.harness.server.connected()).toBe(true)
    const warned = started.harness.logs.lines.filter(
      (line) => line.msg === "nats cannot be reached yet: trying again"
    )
    expect(warned.length).toBeGreaterThan(0)
    const reply = await started.harness.request(
      started.harness.subject("waited-user"),
      JSON.stringify({ op: "get_usage", user: "waited-user" })
    )
    expect(reply.body).toMatchObject({ status: "ok" })
  }, 30_000)

  it("gives up after the wait with the reason", async () => {
    const proxy = await startTcpProxy("127.0.0.1", 4222)
    proxies.push(proxy)
    await proxy.cut()
    const startedAt = Date.now()
    const error = await startHarness({
      label: "startwait",
      server: { servers: `nats://127.0.0.1:${proxy.port}`, startWaitMs: 2_000 }
    }).then(
      (harness) => {
        harnesses.push(harness)
        return undefined
      },
      (cause: unknown) => cause
    )
    const waitedMs = Date.now() - startedAt
    expect(String(error)).toMatch(
      /cannot connect to NATS at nats:\/\/127\.0\.0\.1:\d+: .*(refused|ECONNREFUSED)/i
    )
    expect(waitedMs).toBeGreaterThanOrEqual(2_000)
  }, 30_000)
})
