/**
 * Events from a real `serve` into a real JetStream stream (PROTOCOL.md "Events"): each kind on
 * `{prefix}.v1.events.{kind}.{partition}` with the common fields and `Nats-Msg-Id` = `eventId`, in
 * decision order per user, only for changes; read back through `QuotaClient.events` with acks; and a
 * stream deleted under the coordinator is created again while decisions go on.
 */
import { connect } from "@nats-io/transport-node"
import type { NatsConnection } from "@nats-io/transport-node"
import { jetstreamManager } from "@nats-io/jetstream"
import type { JetStreamManager } from "@nats-io/jetstream"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import type { QuotaClient } from "../../src/client/QuotaClient.js"
import type { QuotaEventMessage } from "../../src/client/events.js"
import { partitionOf } from "../../src/domain/partition.js"
import type { ServedCoordinator } from "../support/operations.js"
import { sleep, startServedCoordinator, waitFor } from "../support/operations.js"

let served: ServedCoordinator
let client: QuotaClient
let nc: NatsConnection
let manager: JetStreamManager
let stream: string

beforeAll(async () => {
  served = await startServedCoordinator("events")
  client = served.client
  stream = `${served.prefix.toUpperCase()}_EVENTS`
  nc = await connect({ servers: served.natsUrl })
  manager = await jetstreamManager(nc)
})

afterAll(async () => {
  await manager?.streams.delete(stream).catch(() => undefined)
  await nc?.close()
  await served?.close()
})

interface Stored {
  readonly subject: string
  readonly msgId: string | undefined
  readonly event: QuotaEventMessage
}

/** Every message of the stream, in stream order. */
const streamMessages = async (): Promise<Array<Stored>> => {
  const info = await manager.streams.info(stream)
  const messages: Array<Stored> = []
  for (let seq = info.state.first_seq; seq <= info.state.last_seq && info.state.messages > 0; seq += 1) {
    const message = await manager.streams.getMessage(stream, { seq })
    if (message === null) continue
    messages.push({
      subject: message.subject,
      msgId: message.header?.get("Nats-Msg-Id"),
      event: message.json<QuotaEventMessage>()
    })
  }
  return messages
}

/** The stream's messages of `user`, once at least `count` are there. */
const eventsOf = (user: string, count: number) =>
  waitFor(
    async () => {
      const mine = (await streamMessages()).filter((message) => message.event.user === user)
      return mine.length >= count ? mine : undefined
    },
    10_000,
    async () =>
      `fewer than ${count} events of ${user}: ${JSON.stringify(await streamMessages().catch(String))}`
  )

describe("events in the stream", () => {
  it("publishes each kind once, in decision order, with the common fields and Nats-Msg-Id = eventId", async () => {
    const user = "ev-ada"
    const partition = partitionOf(user, 64)
    const before = Date.now()
    expect((await client.setLimit({ user, meter: "tokens", limit: 100 })).status).toBe("ok")
    // Changes nothing: no event.
    expect((await client.setLimit({ user, meter: "tokens", limit: 100 })).status).toBe("ok")
    expect((await client.adjust({ user, meter: "tokens", amount: 85, id: "a-1" })).status).toBe("adjusted")
    // A retry changes nothing; a refusal changes nothing.
    expect((await client.adjust({ user, meter: "tokens", amount: 85, id: "a-1" })).status).toBe("exists")
    expect((await client.reserve({ user, meter: "tokens", amount: 50, id: "too-much" })).status).toBe(
      "insufficient_quota"
    )
    expect((await client.setPlan({ user, plan: "free" })).status).toBe("ok")
    expect((await client.setPlan({ user, plan: "pro" })).status).toBe("ok")
    // Used to 100 of 100: the threshold 1 (0.8 is not repeated).
    expect((await client.reserve({ user, meter: "tokens", amount: 10, id: "work" })).status).toBe("reserved")
    expect((await client.commit({ user, id: "work", amount: 15 })).status).toBe("committed")
    // A higher limit and a new consumption do not repeat either threshold of this period.
    expect((await client.setLimit({ user, meter: "tokens", limit: 200 })).status).toBe("ok")
    expect(
      (await client.reserve({ user, meter: "tokens", amount: 10, id: "orphan", ttlMs: 1_000 })).status
    ).toBe("reserved")
    expect((await client.consume({ user, id: "orphan", amount: 4, key: "k" })).status).toBe("consumed")
    expect((await client.acquireSlot({ user, job: "job-1", leaseMs: 1_000 })).status).toBe("acquired")

    const events = await eventsOf(user, 10)
    expect(events.map((message) => message.event.event)).toEqual([
      "limit_changed",
      "usage_recorded",
      "usage_threshold",
      "plan_changed",
      "usage_recorded",
      "usage_threshold",
      "limit_changed",
      "usage_recorded",
      "hold_expired",
      "slot_expired"
    ])
    for (const { subject, msgId, event } of events) {
      expect(subject).toBe(`${served.prefix}.v1.events.${event.event}.${partition}`)
      expect(msgId).toBe(event.eventId)
      expect(event.user).toBe(user)
      expect(event.partition).toBe(partition)
      expect(event.at).toBeGreaterThanOrEqual(before)
    }
    const [
      limit100,
      adjusted,
      threshold80,
      planChanged,
      committed,
      threshold100,
      limit200,
      consumed,
      holdExpired,
      slotExpired
    ] = events.map((message) => message.event as unknown as Record<string, unknown>)
    expect(limit100).toMatchObject({ meter: "tokens", limit: 100 })
    expect(adjusted).toMatchObject({ meter: "tokens", amount: 85, used: 85, source: "adjust", ref: "a-1" })
    expect(adjusted!["periodStart"]).toBe(threshold80!["periodStart"])
    expect(threshold80).toMatchObject({ meter: "tokens", threshold: 0.8, limit: 100, used: 85 })
    expect(typeof threshold80!["periodStart"]).toBe("number")
    expect(planChanged).toMatchObject({ plan: "pro", previousPlan: "free" })
    expect(committed).toMatchObject({ meter: "tokens", amount: 15, used: 100, source: "commit", ref: "work" })
    expect(committed!["key"]).toBeUndefined()
    expect(threshold100).toMatchObject({ meter: "tokens", threshold: 1, limit: 100, used: 100 })
    expect(limit200).toMatchObject({ meter: "tokens", limit: 200 })
    expect(consumed).toMatchObject({
      meter: "tokens",
      amount: 4,
      used: 104,
      source: "consume",
      ref: "orphan",
      key: "k"
    })
    expect(holdExpired).toMatchObject({ meter: "tokens", id: "orphan", amount: 10, consumed: 4, returned: 6 })
    expect(holdExpired!["at"]).toBeGreaterThanOrEqual(before + 1_000)
    expect(slotExpired).toMatchObject({ job: "job-1", plan: "pro" })
    expect(new Set(events.map((message) => message.event.eventId)).size).toBe(events.length)
    // Nothing more arrives for this user: only changes publish.
    await sleep(1_500)
    expect((await streamMessages()).filter((message) => message.event.user === user)).toHaveLength(10)
  })
})

describe("QuotaClient.events", () => {
  it("delivers the kinds asked for, to acknowledge; a durable consumer goes on after what it acknowledged", async () => {
    const user = "ev-bo"
    const durable = `emails-${served.prefix}`
    const subscription = await client.events({ kinds: ["usage_threshold"], durable })
    expect((await client.setLimit({ user, meter: "analysis", limit: 10 })).status).toBe("ok")
    expect((await client.adjust({ user, meter: "analysis", amount: 8, id: "a" })).status).toBe("adjusted")
    const received: Array<QuotaEventMessage> = []
    for await (const delivery of subscription) {
      // Other tests' users share the stream: this reader wants ev-bo's.
      delivery.ack()
      if (delivery.event.user !== user) continue
      received.push(delivery.event)
      break
    }
    await subscription.stop()
    expect(
      received.map((event) => [event.event, "threshold" in event ? event.threshold : undefined])
    ).toEqual([["usage_threshold", 0.8]])

    // Started again under the same name: only what came after.
    expect((await client.adjust({ user, meter: "analysis", amount: 2, id: "b" })).status).toBe("adjusted")
    const again = await client.events({ kinds: ["usage_threshold"], durable })
    const next: Array<QuotaEventMessage> = []
    for await (const delivery of again) {
      delivery.ack()
      if (delivery.event.user !== user) continue
      next.push(delivery.event)
      break
    }
    await again.stop()
    expect(next.map((event) => ("threshold" in event ? event.threshold : undefined))).toEqual([1])
  })

  it("skips the kinds not asked for, several kinds at once", async () => {
    const user = "ev-cy"
    const subscription = await client.events({ kinds: ["plan_changed", "limit_changed"], onlyNew: true })
    expect((await client.setLimit({ user, meter: "analysis", limit: 4 })).status).toBe("ok")
    expect((await client.adjust({ user, meter: "analysis", amount: 4, id: "a" })).status).toBe("adjusted")
    expect((await client.setPlan({ user, plan: "enterprise" })).status).toBe("ok")
    const kinds: Array<string> = []
    for await (const delivery of subscription) {
      delivery.ack()
      if (delivery.event.user !== user) continue
      kinds.push(delivery.event.event)
      if (kinds.length === 2) break
    }
    await subscription.stop()
    expect(kinds).toEqual(["limit_changed", "plan_changed"])
  })
})

describe("the stream gone", () => {
  it("is created again; decisions went on meanwhile and their events arrive", async () => {
    await manager.streams.delete(stream)
    const user = "ev-dee"
    expect((await client.setLimit({ user, meter: "tokens", limit: 10 })).status).toBe("ok")
    expect((await client.setPlan({ user, plan: "pro_plus" })).status).toBe("ok")
    const events = await eventsOf(user, 2)
    expect(events.map((message) => message.event.event)).toEqual(["limit_changed", "plan_changed"])
    const info = await manager.streams.info(stream)
    expect(info.config.subjects).toEqual([`${served.prefix}.v1.events.>`])
    expect(info.config.duplicate_window).toBeGreaterThanOrEqual(120_000_000_000)
    expect(info.config.storage).toBe("file")
  })
})
