/**
 * Discovery ($SRV), moving partitions, draining on stop, and the answers a request gets when the
 * coordinator cannot decide (store down, mailbox full, a defect).
 */
import type { Msg } from "@nats-io/transport-node"
import { Effect, Layer } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { Coordinator } from "../../src/actors/Coordinator.js"
import { partitionOf } from "../../src/domain/partition.js"
import { makeMemoryStore } from "../../src/store/MemoryStore.js"
import type { Harness } from "./support.js"
import { startHarness } from "./support.js"

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms))

/** Every reply to a request that many services answer, gathered for half a second. */
const requestAll = async (harness: Harness, subject: string): Promise<Array<Record<string, unknown>>> => {
  const replies: Array<Msg> = []
  for await (const msg of await harness.client.requestMany(subject, "", { maxWait: 500 })) replies.push(msg)
  return replies.map((msg) => msg.json<Record<string, unknown>>())
}

describe("discovery", () => {
  let harness: Harness
  beforeAll(async () => {
    harness = await startHarness({ label: "srv", partitions: 4, server: { version: "9.8.7" } })
  })
  afterAll(async () => {
    await harness.close()
  })

  it("answers $SRV.PING in all three forms with its metadata", async () => {
    const id = harness.server.serviceId
    const expected = {
      type: "io.nats.micro.v1.ping_response",
      name: "quota-coordinator",
      id,
      version: "9.8.7",
      metadata: { prefix: harness.prefix, partitions: "4", version: "9.8.7" }
    }
    expect((await harness.request(`$SRV.PING.quota-coordinator.${id}`, "")).body).toEqual(expected)
    expect(await requestAll(harness, "$SRV.PING.quota-coordinator")).toContainEqual(expected)
    expect(await requestAll(harness, "$SRV.PING")).toContainEqual(expected)
  })

  it("lists every served subject as an endpoint in $SRV.INFO", async () => {
    const info = (await harness.request(`$SRV.INFO.quota-coordinator.${harness.server.serviceId}`, ""))
      .body as Record<string, unknown>
    expect(info).toMatchObject({
      type: "io.nats.micro.v1.info_response",
      name: "quota-coordinator",
      metadata: { prefix: harness.prefix, partitions: "4" }
    })
    const endpoints = info["endpoints"] as Array<Record<string, unknown>>
    expect(endpoints.map((endpoint) => endpoint["subject"])).toEqual(
      [0, 1, 2, 3].flatMap((p) => [`${harness.prefix}.v1.${p}.ops`, `${harness.prefix}.v1.${p}.admin`])
    )
    expect(endpoints[0]).toMatchObject({ name: "ops-0", queue_group: "q" })
  })

  it("counts requests, errors and processing time in $SRV.STATS", async () => {
    const user = "stats-user"
    const subject = harness.subject(user)
    for (let index = 0; index < 3; index += 1) {
      await harness.request(subject, JSON.stringify({ op: "get_usage", user }))
    }
    await harness.request(subject, "not json")
    const stats = (await harness.request(`$SRV.STATS.quota-coordinator.${harness.server.serviceId}`, ""))
      .body as Record<string, unknown>
    expect(stats).toMatchObject({ type: "io.nats.micro.v1.stats_response", id: harness.server.serviceId })
    expect(Number.isNaN(Date.parse(stats["started"] as string))).toBe(false)
    const endpoint = (stats["endpoints"] as Array<Record<string, number | string>>).find(
      (candidate) => candidate["subject"] === subject
    )
    expect(endpoint).toMatchObject({
      num_requests: 4,
      num_errors: 1,
      last_error: expect.stringContaining("JSON")
    })
    const processing = endpoint?.["processing_time"] as number
    expect(processing).toBeGreaterThan(0)
    expect(endpoint?.["average_processing_time"]).toBe(Math.round(processing / 4))
  })
})

/** Stops the server while `pending` (a call with ref "w") is in flight: it is answered unavailable, soon. */
const stopAndExpectUnavailable = async (harness: Harness, pending: Promise<unknown>, withinMs: number) => {
  await sleep(50)
  const stoppedAt = Date.now()
  await Effect.runPromise(harness.server.stop)
  expect(await pending).toEqual({ status: "unavailable", ref: "w" })
  expect(Date.now() - stoppedAt).toBeLessThan(withinMs)
}

describe("partitions and stop", () => {
  it("stops and resumes serving a partition (no responders in between)", async () => {
    const harness = await startHarness({ label: "move", partitions: 4 })
    try {
      const user = "mover"
      const partition = partitionOf(user, 4)
      const usage = JSON.stringify({ op: "get_usage", user })
      await Effect.runPromise(harness.server.stopPartitions([partition]))
      expect(harness.server.servedPartitions()).not.toContain(partition)
      await expect(harness.request(harness.subject(user), usage)).rejects.toThrow(/no responders/i)
      await Effect.runPromise(harness.server.servePartitions([partition]))
      expect((await harness.request(harness.subject(user), usage)).body).toMatchObject({ status: "ok" })
      const refused = await Effect.runPromise(Effect.flip(harness.server.servePartitions([4])))
      expect(refused._tag).toBe("PartitionOutOfRange")
    } finally {
      await harness.close()
    }
  })

  it("answers requests in flight before it closes, then takes no more", async () => {
    const store = makeMemoryStore({ beforeWrite: () => sleep(300) })
    const harness = await startHarness({ label: "drain", store })
    try {
      const user = "drained"
      const pending = harness.call(user, { op: "reserve", user, meter: "tokens", amount: 1, id: "h" })
      await sleep(50)
      await Effect.runPromise(harness.server.stop)
      expect(await pending).toMatchObject({ status: "reserved" })
      await expect(harness.call(user, { op: "get_usage", user })).rejects.toThrow(/no responders/i)
    } finally {
      await harness.close()
    }
  })

  it("answers a request still being decided after the drain time `unavailable`", async () => {
    let slowWrites = false
    const store = makeMemoryStore({ beforeWrite: () => (slowWrites ? sleep(3_000) : Promise.resolve()) })
    const harness = await startHarness({ label: "late", store, server: { drainMs: 200 } })
    try {
      const user = "slow-writer"
      slowWrites = true
      const writing = harness.call(user, {
        op: "reserve",
        user,
        meter: "tokens",
        amount: 1,
        id: "h",
        ref: "w"
      })
      await stopAndExpectUnavailable(harness, writing, 2_500)
    } finally {
      await harness.close()
    }
  })

  it("answers a waiting acquire_slot `unavailable` as it stops, without waiting out the wait or the drain time", async () => {
    const harness = await startHarness({ label: "waiter", server: { drainMs: 20_000 } })
    try {
      const user = "waiter"
      await harness.call(user, { op: "acquire_slot", user, job: "held" })
      const waiting = harness.call(user, { op: "acquire_slot", user, job: "late", waitMs: 60_000, ref: "w" })
      await stopAndExpectUnavailable(harness, waiting, 5_000)
    } finally {
      await harness.close()
    }
  })
})

describe("when the coordinator cannot decide", () => {
  it("answers unavailable when the store fails, and overloaded when the mailbox is full", async () => {
    let failWrites = false
    const store = makeMemoryStore({
      beforeWrite: async () => {
        await sleep(20)
        if (failWrites) throw new Error("disk on fire")
      }
    })
    const harness = await startHarness({ label: "fail", store, coordinator: { mailboxCapacity: 2 } })
    try {
      const user = "unlucky"
      failWrites = true
      expect(await harness.call(user, { op: "adjust", user, meter: "tokens", amount: 1, id: "a" })).toEqual({
        status: "unavailable"
      })
      failWrites = false
      const batch = Array.from({ length: 10 }, (_, index) => ({
        op: "adjust",
        user,
        meter: "tokens",
        amount: 1,
        id: `b${index}`
      }))
      const statuses = ((await harness.call(user, batch)) as Array<{ status: string }>).map((r) => r.status)
      expect(statuses).toContain("overloaded")
      expect(statuses.slice(0, 2)).toEqual(["adjusted", "adjusted"])
    } finally {
      await harness.close()
    }
  })

  it("turns a coordinator defect into unavailable for the affected commands and keeps answering", async () => {
    const dying = Layer.succeed(Coordinator, {
      submit: () => Effect.die(new Error("boom")),
      submitAll: () => Effect.die(new Error("boom")),
      enqueue: () => {
        throw new Error("boom")
      },
      enqueueIn: () => {
        throw new Error("boom")
      },
      listUsage: () => {
        throw new Error("boom")
      },
      sweepOnce: Effect.succeed(0),
      whenOpened: () => Effect.void,
      residentActors: () => 0,
      slotWaiters: () => 0,
      dropPartitions: () => Effect.void,
      drainPartitions: () => Effect.succeed(true),
      dropAllActors: Effect.void
    })
    const harness = await startHarness({ label: "defect", coordinatorLayer: dying })
    try {
      const user = "victim"
      const replies = await harness.call(user, [
        { op: "get_usage", user, ref: "1" },
        { op: "get_usage", ref: "2" },
        { op: "get_usage", user, ref: "3" }
      ])
      expect(replies).toEqual([
        { status: "unavailable", ref: "1" },
        { status: "invalid_request", error: "user: required", ref: "2" },
        { status: "unavailable", ref: "3" }
      ])
      expect(await harness.call(user, { op: "get_usage", user })).toEqual({ status: "unavailable" })
      expect(harness.logs.lines).toContainEqual(
        expect.objectContaining({ msg: "coordinator defect", level: 50 })
      )
    } finally {
      await harness.close()
    }
  })
})
