/**
 * The way back from a silent NATS cut (issue 26, item 6), at the transport alone: the coordinator's
 * connection goes through a proxy that passes nothing (what is sent is lost, a close by the server
 * too). Its pings see the silence; its first reconnect attempt, begun then, never hears the server's
 * greeting. The network heals 3 s later: the connection must be back within an attempt's timeout and
 * the wait between attempts, not when nats.js's 20 s connect timeout ends.
 * test/cluster/natsSilent.test.ts checks the same under load with three processes.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { natsConnectAttemptTimeoutMs, natsReconnectWaitMs } from "../../src/domain/limits.js"
import type { TcpProxy } from "../support/tcpProxy.js"
import { startTcpProxy } from "../support/tcpProxy.js"
import type { Harness } from "./support.js"
import { startHarness } from "./support.js"

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms))

/** Longer than the server takes to close the attempt it never got a CONNECT on: that close is lost too. */
const silenceAfterLossMs = 3_000
/** An attempt begun just before the heal is given up, and the next begins (jitter and a connect on top). */
const backBoundMs = Math.max(natsConnectAttemptTimeoutMs, natsReconnectWaitMs) + 1_000
/** Waited for longer than the bound, to say how late it was (nats.js's default timeout is 20 s). */
const watchedMs = 20_000

describe("a silent NATS cut that heals", () => {
  let proxy: TcpProxy
  let harness: Harness
  const changes: Array<{ up: boolean; at: number }> = []

  beforeAll(async () => {
    proxy = await startTcpProxy("127.0.0.1", 4222)
    harness = await startHarness({
      label: "heal",
      server: { servers: `nats://127.0.0.1:${proxy.port}`, pingIntervalMs: 500 }
    })
    harness.server.onConnectionChange((up) => changes.push({ up, at: Date.now() }))
  })

  afterAll(async () => {
    await harness?.close()
    await proxy?.close()
  })

  const waitForChange = async (up: boolean, since: number, deadlineMs: number) => {
    while (Date.now() - since < deadlineMs) {
      const change = changes.find((candidate) => candidate.up === up && candidate.at >= since)
      if (change !== undefined) return change.at
      await sleep(20)
    }
    return undefined
  }

  it(`is noticed within ${backBoundMs} ms of the heal`, async () => {
    expect(harness.server.connected()).toBe(true)
    const cutAt = Date.now()
    proxy.silence({ bytes: "lost" })
    const lostAt = await waitForChange(false, cutAt, 10_000)
    expect(lostAt, "the pings never saw the silence").toBeDefined()
    await sleep(silenceAfterLossMs)
    const healedAt = Date.now()
    proxy.resume()
    const backAt = await waitForChange(true, healedAt, watchedMs)
    const summary =
      `lost ${lostAt! - cutAt} ms after the cut, healed ${healedAt - lostAt!} ms after that, ` +
      `back ${backAt === undefined ? `NOT within ${watchedMs} ms` : `${backAt - healedAt} ms`} after the heal`
    console.log(summary)
    expect(backAt, summary).toBeDefined()
    expect(backAt! - healedAt, summary).toBeLessThanOrEqual(backBoundMs)
    expect(harness.server.connected()).toBe(true)
  }, 40_000)
})
