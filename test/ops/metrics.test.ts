/**
 * The metrics move where the facts are decided, seen from outside through GET /metrics of a real
 * `serve` (NATS, Postgres, the HTTP server): each command counted by op and status with its latency, a
 * snooze by plan, a waiter while it waits, an orphaned hold's expiry by meter, group commits, resident
 * actors and owned partitions. (Fenced writes: test/store/fence.test.ts and the split-brain test.)
 */
import { connect } from "@nats-io/transport-node"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import type { QuotaClient } from "../../src/client/QuotaClient.js"
import { partitionOf } from "../../src/domain/partition.js"
import type { Samples, ServedCoordinator } from "../support/operations.js"
import { sample, scrape, sleep, startServedCoordinator, waitFor } from "../support/operations.js"

let served: ServedCoordinator
let client: QuotaClient
let httpPort: number

beforeAll(async () => {
  served = await startServedCoordinator("metrics")
  ;({ client, httpPort } = served)
})

afterAll(() => served?.close())

/** The change of every series between two scrapes (series absent before count from 0). */
const delta = (before: Samples, after: Samples, name: string, labels: Record<string, string> = {}) =>
  sample(after, name, labels) - sample(before, name, labels)

describe("GET /metrics", () => {
  it("counts every answered command by op and status, with its receipt-to-reply latency", async () => {
    const before = await scrape(httpPort)
    expect((await client.reserve({ user: "m-alice", meter: "tokens", amount: 10, id: "r1" })).status).toBe(
      "reserved"
    )
    expect(
      (await client.reserve({ user: "m-alice", meter: "tokens", amount: 10_000_000, id: "r2" })).status
    ).toBe("insufficient_quota")
    expect((await client.commit({ user: "m-alice", id: "r1", amount: 7 })).status).toBe("committed")
    // A command the coordinator cannot read: counted under op "unknown".
    const nc = await connect({ servers: served.natsUrl })
    const subject = `${served.prefix}.v1.${partitionOf("m-alice", 64)}.ops`
    const refused = (await nc.request(subject, JSON.stringify({ op: "bogus", user: "m-alice" }))).json<{
      status: string
    }>()
    await nc.close()
    expect(refused.status).toBe("invalid_request")

    const after = await scrape(httpPort)
    const counted = (op: string, status: string) =>
      delta(before, after, "quota_commands_total", { op, status })
    expect(counted("reserve", "reserved")).toBe(1)
    expect(counted("reserve", "insufficient_quota")).toBe(1)
    expect(counted("commit", "committed")).toBe(1)
    expect(counted("unknown", "invalid_request")).toBe(1)
    expect(delta(before, after, "quota_command_duration_seconds_count", { op: "reserve" })).toBe(2)
    expect(delta(before, after, "quota_command_duration_seconds_count", { op: "commit" })).toBe(1)
    expect(delta(before, after, "quota_command_duration_seconds_bucket", { op: "reserve", le: "+Inf" })).toBe(
      2
    )
    expect(delta(before, after, "quota_command_duration_seconds_sum", { op: "reserve" })).toBeGreaterThan(0)
    // Two writes (the grant, the commit): at least one group commit each, none failed.
    expect(delta(before, after, "quota_store_commit_duration_seconds_count")).toBeGreaterThanOrEqual(2)
    expect(delta(before, after, "quota_store_commits_failed_total")).toBe(0)
    expect(sample(after, "quota_actors_resident")).toBeGreaterThanOrEqual(1)
    expect(sample(after, "quota_partitions_owned")).toBe(64)
    // The Node process's own.
    expect(after.has("process_cpu_seconds_total")).toBe(true)
    expect(after.has("nodejs_eventloop_lag_p99_seconds")).toBe(true)
    expect(after.has("process_resident_memory_bytes")).toBe(true)
  })

  it("counts a snooze by plan, and a waiter while it waits", async () => {
    const user = "m-bob"
    expect((await client.acquireSlot({ user, job: "a" })).status).toBe("acquired")
    const before = await scrape(httpPort)
    expect((await client.acquireSlot({ user, job: "b" })).status).toBe("busy")
    const afterBusy = await scrape(httpPort)
    expect(delta(before, afterBusy, "quota_slots_busy_total", { plan: "free" })).toBe(1)
    expect(delta(before, afterBusy, "quota_commands_total", { op: "acquire_slot", status: "busy" })).toBe(1)

    const waiting = client.acquireSlot({ user, job: "c", waitMs: 10_000 })
    const whileWaiting = await waitFor(
      async () => {
        const samples = await scrape(httpPort)
        return sample(samples, "quota_slot_waiters") === 1 ? samples : undefined
      },
      5_000,
      () => "quota_slot_waiters never showed the waiting acquire_slot"
    )
    expect(sample(whileWaiting, "quota_slot_waiters")).toBe(1)
    expect((await client.releaseSlot({ user, job: "a" })).status).toBe("released")
    expect((await waiting).status).toBe("acquired")
    expect(sample(await scrape(httpPort), "quota_slot_waiters")).toBe(0)
  })

  it("counts an orphaned hold's expiry by its meter", async () => {
    const before = await scrape(httpPort)
    const reserved = await client.reserve({
      user: "m-carol",
      meter: "analysis",
      amount: 1,
      id: "orphan",
      ttlMs: 1_000
    })
    expect(reserved.status).toBe("reserved")
    const after = await waitFor(
      async () => {
        const samples = await scrape(httpPort)
        return delta(before, samples, "quota_holds_expired_total", { meter: "analysis" }) >= 1
          ? samples
          : undefined
      },
      10_000,
      () => "quota_holds_expired_total{meter=analysis} did not move"
    )
    expect(delta(before, after, "quota_holds_expired_total", { meter: "analysis" })).toBe(1)
    expect(delta(before, after, "quota_holds_expired_total", { meter: "tokens" })).toBe(0)
    // Every configured meter and plan has its series from the start, at 0 until counted.
    expect(after.has('quota_holds_expired_total{meter="storage_bytes"}')).toBe(true)
    expect(after.has('quota_slots_busy_total{plan="enterprise"}')).toBe(true)
    await sleep(0)
  })

  it("answers 404 and 405 for what it does not serve", async () => {
    const base = `http://127.0.0.1:${httpPort}`
    expect((await fetch(`${base}/nope`)).status).toBe(404)
    expect((await fetch(`${base}/metrics`, { method: "POST" })).status).toBe(405)
    const health = await fetch(`${base}/healthz`)
    expect(health.status).toBe(200)
    expect(await health.json()).toEqual({ status: "ok" })
  })
})
