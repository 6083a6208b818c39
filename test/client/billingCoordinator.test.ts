/**
 * The client's billing calls against the real coordinator (PROTOCOL.md revision 1.3): `usageHistory`'s
 * shape and refusals, `listUsage` paged by 2 in UTF-8 byte order with non-ASCII users, its refusals,
 * `usagePages` over all 64 partitions agreeing with `get_usage`, and `usage_recorded` as the events
 * consumer delivers it: a consume with its key, a refund below what was consumed, a `none` meter.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import type { QuotaClient } from "../../src/client/QuotaClient.js"
import type { QuotaEventMessage, UsagePage, UsageRecordedEvent } from "../../src/client/index.js"
import { UsageListRefused } from "../../src/client/index.js"
import { partitionOf } from "../../src/domain/partition.js"
import { billingUsers, dayStart, monthStart, utf8Order, writeBillingConfig } from "../support/billing.js"
import type { ServedCoordinator } from "../support/operations.js"
import { startServedCoordinator } from "../support/operations.js"

const partitions = 64
let served: ServedCoordinator
let client: QuotaClient
let users: ReadonlyArray<string>
const used = new Map<string, number>()
const month = monthStart(Date.now())
const day = dayStart(Date.now())

beforeAll(async () => {
  served = await startServedCoordinator("billing", { QUOTA_CONFIG: await writeBillingConfig() })
  client = served.client
  users = billingUsers(served.prefix, partitions)
  await Promise.all(
    users.map(async (user, index) => {
      expect((await client.adjust({ user, meter: "tokens", amount: 100 + index, id: "a" })).status).toBe(
        "adjusted"
      )
      used.set(user, 100 + index)
    })
  )
}, 60_000)

afterAll(() => served?.close())

describe("usageHistory", () => {
  it("answers every month or day meter in configuration order, the current period first", async () => {
    const user = users[0]!
    const history = await client.usageHistory(user)
    expect(history).toEqual({
      status: "ok",
      history: [
        { meter: "tokens", period: "month", periods: [{ periodStart: month, used: used.get(user) }] },
        { meter: "renders", period: "day", periods: [{ periodStart: day, used: 0 }] }
      ]
    })
    expect(await client.usageHistory(user, { meter: "tokens", periods: 1, ref: "r" })).toEqual({
      status: "ok",
      ref: "r",
      history: [{ meter: "tokens", period: "month", periods: [{ periodStart: month, used: used.get(user) }] }]
    })
  })

  it("refuses an unknown meter, a none meter and periods outside 1 to 36", async () => {
    const user = users[0]!
    expect((await client.usageHistory(user, { meter: "nope" })).status).toBe("unknown_meter")
    expect((await client.usageHistory(user, { meter: "storage_bytes" })).status).toBe("invalid_request")
    for (const periods of [0, 37, 1.5])
      expect((await client.usageHistory(user, { periods })).status, String(periods)).toBe("invalid_request")
    expect((await client.usageHistory(user, { periods: 36 })).status).toBe("ok")
  })
})

describe("listUsage", () => {
  it("pages a partition by 2 in UTF-8 byte order, with after = the last user, until more is false", async () => {
    const partition = partitionOf(users[0]!, partitions)
    const ours = users.filter((user) => partitionOf(user, partitions) === partition)
    expect(ours.length).toBeGreaterThan(4)
    const listed: Array<{ user: string; used: number }> = []
    const pageSizes: Array<number> = []
    let after: string | undefined
    for (;;) {
      const page = await client.listUsage(partition, {
        meter: "tokens",
        periodStart: month,
        limit: 2,
        ...(after === undefined ? {} : { after })
      })
      if (page.status !== "ok") throw new Error(`list_usage answered ${page.status}`)
      listed.push(...page.usage)
      pageSizes.push(page.usage.length)
      if (!page.more) break
      after = page.usage.at(-1)!.user
    }
    expect(pageSizes.slice(0, -1).every((size) => size === 2)).toBe(true)
    expect(listed).toEqual([...ours].sort(utf8Order).map((user) => ({ user, used: used.get(user) })))
  })

  it("refuses a missing or misplaced periodStart, a later period and an unknown meter", async () => {
    const partition = partitionOf(users[0]!, partitions)
    const nextMonth = Date.UTC(new Date(month).getUTCFullYear(), new Date(month).getUTCMonth() + 1, 1)
    for (const options of [
      { meter: "tokens" },
      { meter: "tokens", periodStart: month + 86_400_000 },
      { meter: "tokens", periodStart: nextMonth },
      { meter: "storage_bytes", periodStart: month },
      { meter: "tokens", periodStart: month, limit: 0 },
      { meter: "tokens", periodStart: month, limit: 1_001 },
      { meter: "tokens", periodStart: month, after: "" }
    ])
      expect((await client.listUsage(partition, options)).status, JSON.stringify(options)).toBe(
        "invalid_request"
      )
    expect((await client.listUsage(partition, { meter: "nope", periodStart: month })).status).toBe(
      "unknown_meter"
    )
  })
})

describe("usagePages", () => {
  it("walks all 64 partitions and finds every user with get_usage's figure, once", async () => {
    const pages: Array<UsagePage> = []
    for await (const page of client.usagePages({ meter: "tokens", periodStart: month, limit: 2 }))
      pages.push(page)
    expect(new Set(pages.map((page) => page.partition)).size).toBe(partitions)
    const rows = pages.flatMap((page) => page.usage)
    expect(rows).toHaveLength(users.length)
    expect(new Map(rows.map((row) => [row.user, row.used]))).toEqual(used)
  })

  it("ends with UsageListRefused on partition 0 for an unknown meter", async () => {
    const walk = async () => {
      for await (const page of client.usagePages({ meter: "nope", periodStart: month })) void page
    }
    await expect(walk()).rejects.toBeInstanceOf(UsageListRefused)
    await expect(walk()).rejects.toMatchObject({ partition: 0, result: { status: "unknown_meter" } })
  })
})

describe("usage_recorded in the events consumer", () => {
  it("carries a consume's key, a commit's refund as a negative amount, and a none meter's null period", async () => {
    const user = `events-é-${served.prefix}`
    const subscription = await client.events({ kinds: ["usage_recorded"], onlyNew: true })
    expect((await client.reserve({ user, meter: "tokens", amount: 100, id: "job" })).status).toBe("reserved")
    expect((await client.consume({ user, id: "job", amount: 60, key: "k1" })).status).toBe("consumed")
    expect((await client.commit({ user, id: "job", amount: 45 })).status).toBe("committed")
    expect((await client.adjust({ user, meter: "storage_bytes", amount: 7, id: "s" })).status).toBe(
      "adjusted"
    )
    const received: Array<QuotaEventMessage> = []
    for await (const delivery of subscription) {
      delivery.ack()
      if (delivery.event.user === user) received.push(delivery.event)
      if (received.length === 3) break
    }
    await subscription.stop()
    const common = { event: "usage_recorded", user, partition: partitionOf(user, partitions) }
    expect(received).toMatchObject([
      {
        ...common,
        meter: "tokens",
        periodStart: month,
        amount: 60,
        used: 60,
        source: "consume",
        ref: "job",
        key: "k1"
      },
      { ...common, meter: "tokens", periodStart: month, amount: -15, used: 45, source: "commit", ref: "job" },
      { ...common, meter: "storage_bytes", periodStart: null, amount: 7, used: 7, source: "adjust", ref: "s" }
    ])
    const [consume, refund] = received as Array<UsageRecordedEvent & QuotaEventMessage>
    expect(refund!.key).toBeUndefined()
    expect(consume!.eventId).not.toBe(refund!.eventId)
  })
})
