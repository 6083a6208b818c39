/**
 * The client's billing calls (PROTOCOL.md revision 1.3) against a stand-in coordinator on the real
 * nats-server: `usageHistory` and `listUsage` send exactly the shared vectors' commands
 * (clients/testdata/vectors.json "billing", which the Go client reads too) to the `.admin` subject of
 * the user's partition, or of the partition named for `list_usage`, and give back the reply as it
 * came; `usagePages` walks every partition page by page; the events consumer delivers `usage_recorded`
 * as published. test/client/billingCoordinator.test.ts runs the same calls against the real server.
 */
import { readFileSync } from "node:fs"
import { jetstreamManager } from "@nats-io/jetstream"
import { connect } from "@nats-io/transport-node"
import type { NatsConnection } from "@nats-io/transport-node"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { QuotaClient, UsageListRefused } from "../../src/client/index.js"
import type { QuotaEventMessage, UsagePage } from "../../src/client/index.js"
import { defaultStreamName } from "../../src/config/eventSettings.js"
import { partitionOf } from "../../src/domain/partition.js"
import type { Answer, Command } from "./fakeCoordinator.js"
import { FakeCoordinator, natsUrl, randomPrefix } from "./fakeCoordinator.js"

interface CallVector {
  readonly note: string
  readonly op: "usage_history" | "list_usage"
  readonly input: Readonly<Record<string, unknown>>
  readonly wire: Readonly<Record<string, unknown>>
  readonly reply: Answer
}

interface EventVector {
  readonly note: string
  readonly body: QuotaEventMessage
}

const { billing } = JSON.parse(
  readFileSync(new URL("../../clients/testdata/vectors.json", import.meta.url), "utf8")
) as {
  readonly billing: { readonly calls: ReadonlyArray<CallVector>; readonly events: ReadonlyArray<EventVector> }
}

const partitions = 64

/** What a test's stand-in answers `list_usage`, per partition: the users with usage, any order. */
type Listed = ReadonlyMap<number, ReadonlyArray<{ readonly user: string; readonly used: number }>>

const utf8Order = (a: string, b: string): number => Buffer.compare(Buffer.from(a), Buffer.from(b))

/** `list_usage` as PROTOCOL.md says: users after `after` by UTF-8 bytes, at most `limit`, and `more`. */
const listFrom = (listed: Listed, partition: number, command: Command): Answer => {
  const limit = typeof command["limit"] === "number" ? command["limit"] : 1_000
  const after = command["after"]
  const rows = [...(listed.get(partition) ?? [])]
    .sort((a, b) => utf8Order(a.user, b.user))
    .filter((row) => typeof after !== "string" || utf8Order(row.user, after) > 0)
  return { status: "ok", usage: rows.slice(0, limit), more: rows.length > limit }
}

/** The same fields with the same values, in any order (JSON objects have none). */
const sameFields = (a: Readonly<Record<string, unknown>>, b: Readonly<Record<string, unknown>>): boolean =>
  Object.keys(a).length === Object.keys(b).length &&
  Object.entries(a).every(([key, value]) => b[key] === value)

let fake: FakeCoordinator
let client: QuotaClient
let prefix: string
/** Each test's answer to `list_usage` (by the partition of the subject). */
let answerList: (partition: number, command: Command) => Answer

beforeAll(async () => {
  prefix = randomPrefix("billing")
  fake = await FakeCoordinator.start({
    prefix,
    partitions,
    answer: (command, stand) => {
      if (command.op === "list_usage") return answerList(stand.received.at(-1)!.partition, command)
      const vector = billing.calls.find((call) => sameFields(call.wire, command))
      return vector?.reply
    }
  })
  client = new QuotaClient(await connect({ servers: natsUrl }), { prefix, partitions }, true)
})

afterAll(async () => {
  await client?.close()
  await fake?.stop()
})

describe("the billing vectors shared with the Go client", () => {
  for (const vector of billing.calls)
    it(`${vector.op}: ${vector.note}`, async () => {
      answerList = () => vector.reply
      const before = fake.received.length
      const { input } = vector
      const result =
        vector.op === "usage_history"
          ? await client.usageHistory(String(input["user"]), {
              ...(input["meter"] === undefined ? {} : { meter: String(input["meter"]) }),
              ...(input["periods"] === undefined ? {} : { periods: Number(input["periods"]) }),
              ...(input["ref"] === undefined ? {} : { ref: String(input["ref"]) })
            })
          : await client.listUsage(Number(input["partition"]), {
              meter: String(input["meter"]),
              ...(input["periodStart"] === undefined ? {} : { periodStart: Number(input["periodStart"]) }),
              ...(input["after"] === undefined ? {} : { after: String(input["after"]) }),
              ...(input["limit"] === undefined ? {} : { limit: Number(input["limit"]) })
            })
      const sent = fake.received.slice(before)
      expect(sent).toHaveLength(1)
      const partition =
        vector.op === "usage_history" ? partitionOf(String(input["user"]), partitions) : input["partition"]
      expect(sent[0]!.subject).toBe(`${prefix}.v1.${String(partition)}.admin`)
      expect(sent[0]!.commands).toEqual([vector.wire])
      expect(result).toEqual(vector.reply)
    })
})

describe("listUsage", () => {
  it("refuses a partition outside 0 to partitions - 1 without sending anything", async () => {
    const before = fake.received.length
    for (const partition of [-1, partitions, 1.5, Number.NaN])
      await expect(client.listUsage(partition, { meter: "tokens" })).rejects.toThrow(RangeError)
    expect(fake.received.length).toBe(before)
  })

  it("has an Effect flavour that answers the same", async () => {
    answerList = () => ({ status: "ok", usage: [{ user: "a", used: 1 }], more: false })
    const { Effect } = await import("effect")
    expect(await Effect.runPromise(client.effect.listUsage(9, { meter: "tokens" }))).toEqual({
      status: "ok",
      usage: [{ user: "a", used: 1 }],
      more: false
    })
  })
})

describe("usagePages", () => {
  const collect = async (pages: AsyncIterable<UsagePage>): Promise<Array<UsagePage>> => {
    const collected: Array<UsagePage> = []
    for await (const page of pages) collected.push(page)
    return collected
  }

  it("walks every partition in order, each page by page with after = the last user, until more is false", async () => {
    // Users in partitions 0, 3 and 63, more than a page of 2 in two of them, non-ASCII among them.
    const listed = new Map<number, Array<{ user: string; used: number }>>([
      [
        0,
        [
          { user: "z", used: 1 },
          { user: "a", used: 2 },
          { user: "é", used: 3 },
          { user: "m", used: 4 },
          { user: "b", used: 5 }
        ]
      ],
      [3, [{ user: "solo", used: 6 }]],
      [
        63,
        [
          { user: "日本", used: 7 },
          { user: "Z", used: 8 },
          { user: "ä", used: 9 }
        ]
      ]
    ])
    answerList = (partition, command) => listFrom(listed, partition, command)
    const before = fake.received.length
    const pages = await collect(
      client.usagePages({ meter: "tokens", periodStart: 1_788_220_800_000, limit: 2 })
    )

    const sent = fake.received.slice(before)
    // One request at a time: every message carries one command; partitions 0 to 63 in order.
    expect(sent.every((message) => message.commands.length === 1)).toBe(true)
    expect([...new Set(sent.map((message) => message.partition))]).toEqual([...Array(partitions).keys()])
    expect(
      sent.filter((message) => message.partition === 0).map((message) => message.commands[0]!["after"])
    ).toEqual([undefined, "b", "z"])
    expect(sent[0]!.commands[0]).toEqual({
      op: "list_usage",
      meter: "tokens",
      periodStart: 1_788_220_800_000,
      limit: 2
    })
    // Every user once, in UTF-8 byte order within its partition; no page over the limit.
    expect(pages.every((page) => page.usage.length <= 2)).toBe(true)
    expect(
      pages.flatMap((page) => page.usage.map((row) => `${page.partition}:${row.user}:${row.used}`))
    ).toEqual(["0:a:2", "0:b:5", "0:m:4", "0:z:1", "0:é:3", "3:solo:6", "63:Z:8", "63:ä:9", "63:日本:7"])
    expect(pages.length).toBe(partitions + 3)
  })

  it("leaves periodStart out for a none meter", async () => {
    answerList = () => ({ status: "ok", usage: [], more: false })
    const before = fake.received.length
    await collect(client.usagePages({ meter: "storage_bytes" }))
    expect(fake.received[before]!.commands[0]).toEqual({ op: "list_usage", meter: "storage_bytes" })
  })

  it("ends with UsageListRefused at the first refusal, after the pages before it", async () => {
    answerList = (partition) =>
      partition === 5
        ? { status: "invalid_request", error: "periodStart: later than the current period" }
        : { status: "ok", usage: [{ user: `u${partition}`, used: 1 }], more: false }
    const seen: Array<number> = []
    const walk = async () => {
      for await (const page of client.usagePages({ meter: "tokens", periodStart: 1 }))
        seen.push(page.partition)
    }
    const error = await walk().then(
      () => undefined,
      (failure: unknown) => failure
    )
    expect(error).toBeInstanceOf(UsageListRefused)
    expect(error).toMatchObject({ partition: 5, meter: "tokens", result: { status: "invalid_request" } })
    expect((error as Error).message).toContain("later than the current period")
    expect(seen).toEqual([0, 1, 2, 3, 4])
  })

  it("fails instead of asking forever when a reply says more with no user", async () => {
    answerList = () => ({ status: "ok", usage: [], more: true })
    await expect(collect(client.usagePages({ meter: "tokens", periodStart: 1 }))).rejects.toThrow(
      /more with an empty usage list/
    )
  })
})

describe("usage_recorded in the events consumer", () => {
  let nc: NatsConnection
  const stream = () => defaultStreamName(prefix)

  beforeAll(async () => {
    nc = await connect({ servers: natsUrl })
    const manager = await jetstreamManager(nc)
    await manager.streams.add({ name: stream(), subjects: [`${prefix}.v1.events.>`], max_bytes: 1024 * 1024 })
  })

  afterAll(async () => {
    await (await jetstreamManager(nc)).streams.delete(stream()).catch(() => false)
    await nc.close()
  })

  it("delivers each body as published, typed, and only usage_recorded when asked for that kind", async () => {
    const other = {
      event: "plan_changed",
      eventId: "db1-100",
      user: "acct-42",
      partition: 3,
      at: 1,
      plan: "pro",
      previousPlan: "free"
    }
    for (const body of [other, ...billing.events.map((vector) => vector.body)])
      nc.publish(`${prefix}.v1.events.${body.event}.${body.partition}`, JSON.stringify(body))
    await nc.flush()
    const subscription = await client.events({ kinds: ["usage_recorded"] })
    const received: Array<QuotaEventMessage> = []
    for await (const delivery of subscription) {
      received.push(delivery.event)
      delivery.ack()
      if (received.length === billing.events.length) break
    }
    await subscription.stop()
    expect(received).toEqual(billing.events.map((vector) => vector.body))
    // The type narrows on `event`: a billing consumer reads the signed amount and its period.
    const refund = received[1]!
    expect(refund.event === "usage_recorded" ? [refund.amount, refund.source, refund.key] : []).toEqual([
      -200,
      "commit",
      undefined
    ])
  })
})
