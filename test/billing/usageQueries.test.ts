/**
 * PROTOCOL.md revision 1.3 against a real `serve` (Postgres, NATS): `usage_history` (current period from
 * the coordinator, past periods from the store, newest first, only those with usage) and `list_usage`
 * (a partition's users with usage in one period, in the UTF-8 byte order of their ids, paged), and
 * every bad input of the two. Past periods are seeded as rows of earlier months, as a coordinator
 * running then would have written them.
 */
import { connect } from "@nats-io/transport-node"
import type { NatsConnection } from "@nats-io/transport-node"
import pg from "pg"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { partitionOf } from "../../src/domain/partition.js"
import type { ServedCoordinator } from "../support/operations.js"
import { startServedCoordinator } from "../support/operations.js"

const partitions = 64
let served: ServedCoordinator
let nc: NatsConnection
let database: pg.Client

beforeAll(async () => {
  served = await startServedCoordinator("billing-queries")
  nc = await connect({ servers: served.natsUrl })
  database = new pg.Client({ connectionString: served.databaseUrl })
  await database.connect()
})

afterAll(async () => {
  await database?.end()
  await nc?.close()
  await served?.close()
})

/** One command to `.admin` of `partition` (a user's own partition when it names one); its reply. */
const admin = async (
  command: Record<string, unknown>,
  partition?: number
): Promise<Record<string, unknown>> => {
  const to = partition ?? partitionOf(command["user"] as string, partitions)
  const reply = await nc.request(`${served.prefix}.v1.${to}.admin`, JSON.stringify(command), {
    timeout: 5_000
  })
  return reply.json<Record<string, unknown>>()
}

const ops = async (command: Record<string, unknown>): Promise<Record<string, unknown>> => {
  const to = partitionOf(command["user"] as string, partitions)
  const reply = await nc.request(`${served.prefix}.v1.${to}.ops`, JSON.stringify(command), { timeout: 5_000 })
  return reply.json<Record<string, unknown>>()
}

const monthStart = (monthsBack: number): number => {
  const now = new Date()
  return Date.UTC(now.getUTCFullYear(), now.getUTCMonth() - monthsBack, 1)
}
/** A row of a past period, as the coordinator of that time wrote it. */
const seedPast = async (user: string, meter: string, periodStart: number, used: number): Promise<void> => {
  await database.query(
    `insert into quota.usage_totals (user_id, meter, period_start, used, partition) values ($1, $2, $3, $4, $5)`,
    [user, meter, periodStart, used, partitionOf(user, partitions)]
  )
}

describe("usage_history", () => {
  it("the current period always, then each earlier period with usage, newest first, within `periods`", async () => {
    const user = "hist-ada"
    expect((await ops({ op: "adjust", user, meter: "analysis", amount: 30, id: "a1" })).status).toBe(
      "adjusted"
    )
    await seedPast(user, "analysis", monthStart(1), 120)
    await seedPast(user, "analysis", monthStart(3), 7)
    await seedPast(user, "analysis", monthStart(5), 0)
    await seedPast(user, "analysis", monthStart(12), 99)
    await seedPast(user, "analysis", monthStart(40), 5)

    const all = await admin({ op: "usage_history", user, meter: "analysis" })
    expect(all).toEqual({
      status: "ok",
      history: [
        {
          meter: "analysis",
          period: "month",
          periods: [
            { periodStart: monthStart(0), used: 30 },
            { periodStart: monthStart(1), used: 120 },
            { periodStart: monthStart(3), used: 7 }
          ]
        }
      ]
    })
    const longer = await admin({ op: "usage_history", user, meter: "analysis", periods: 13 })
    expect(
      (longer["history"] as Array<{ periods: Array<{ periodStart: number }> }>)[0]!.periods.map(
        (p) => p.periodStart
      )
    ).toEqual([monthStart(0), monthStart(1), monthStart(3), monthStart(12)])
    const two = await admin({ op: "usage_history", user, meter: "analysis", periods: 2 })
    expect((two["history"] as Array<{ periods: unknown }>)[0]!.periods).toEqual([
      { periodStart: monthStart(0), used: 30 },
      { periodStart: monthStart(1), used: 120 }
    ])
  })

  it("every meter with a period, in configuration order, when no meter is named; `none` meters left out", async () => {
    const user = "hist-bea"
    await seedPast(user, "tokens", monthStart(2), 500)
    const reply = await admin({ op: "usage_history", user })
    expect(reply).toEqual({
      status: "ok",
      history: [
        { meter: "analysis", period: "month", periods: [{ periodStart: monthStart(0), used: 0 }] },
        { meter: "specview", period: "month", periods: [{ periodStart: monthStart(0), used: 0 }] },
        {
          meter: "tokens",
          period: "month",
          periods: [
            { periodStart: monthStart(0), used: 0 },
            { periodStart: monthStart(2), used: 500 }
          ]
        }
      ]
    })
  })

  it.each([
    [{ meter: "storage_bytes" }, "invalid_request"],
    [{ meter: "nope" }, "unknown_meter"],
    [{ meter: "Not A Meter" }, "invalid_request"],
    [{ meter: 7 }, "invalid_request"],
    [{ periods: 0 }, "invalid_request"],
    [{ periods: 37 }, "invalid_request"],
    [{ periods: 1.5 }, "invalid_request"],
    [{ periods: "12" }, "invalid_request"],
    [{ user: "" }, "invalid_request"],
    [{ user: "x".repeat(257) }, "invalid_request"],
    [{ periods: 36 }, "ok"],
    [{ periods: null, meter: null }, "ok"]
  ])("usage_history %j: %s", async (fields, status) => {
    const command = { op: "usage_history", user: "hist-bad", ...fields }
    const partition = typeof command.user === "string" ? partitionOf(command.user, partitions) : 0
    expect((await admin(command, partition))["status"]).toBe(status)
  })

  it("is refused on .ops", async () => {
    const reply = await ops({ op: "usage_history", user: "hist-ops" })
    expect(reply["status"]).toBe("invalid_request")
  })
})

/** `count` distinct users of `partition`, each starting with one of `stems`. */
const usersOf = (partition: number, stems: ReadonlyArray<string>): Array<string> =>
  stems.map((stem) => {
    for (let index = 0; ; index += 1) {
      const user = `${stem}${index}`
      if (partitionOf(user, partitions) === partition) return user
    }
  })

const utf8Order = (users: ReadonlyArray<string>): Array<string> =>
  [...users].sort((a, b) => Buffer.compare(Buffer.from(a, "utf8"), Buffer.from(b, "utf8")))

describe("list_usage", () => {
  const partition = 11
  // UTF-16 order and UTF-8 byte order disagree on the last two (U+FF21 against a surrogate pair), and
  // an id holding U+0000 is stored escaped: the order is the ids' bytes all the same.
  const users = usersOf(partition, [
    "list-zoë",
    "list-Åsa",
    "list-a",
    "list-a\u0000b",
    "list-\uFF21",
    "list-\u{1F600}"
  ])
  const idle = usersOf(partition, ["list-idle"])[0]!

  beforeAll(async () => {
    for (const [index, user] of users.entries()) {
      expect((await ops({ op: "adjust", user, meter: "analysis", amount: index + 1, id: "l1" })).status).toBe(
        "adjusted"
      )
      expect(
        (await ops({ op: "adjust", user, meter: "storage_bytes", amount: 1_000 + index, id: "s1" })).status
      ).toBe("adjusted")
    }
    // Usage that went back to 0 is not listed.
    expect((await ops({ op: "adjust", user: idle, meter: "analysis", amount: 5, id: "i1" })).status).toBe(
      "adjusted"
    )
    expect((await ops({ op: "adjust", user: idle, meter: "analysis", amount: -5, id: "i2" })).status).toBe(
      "adjusted"
    )
    await seedPast(users[0]!, "analysis", monthStart(1), 77)
  })

  it("lists the partition's users with usage in UTF-8 byte order, paged with after and more", async () => {
    const expected = utf8Order(users)
    const seen: Array<{ user: string; used: number }> = []
    let after: string | undefined
    let pages = 0
    for (;;) {
      const reply = await admin(
        {
          op: "list_usage",
          meter: "analysis",
          periodStart: monthStart(0),
          limit: 4,
          ...(after === undefined ? {} : { after })
        },
        partition
      )
      expect(reply["status"]).toBe("ok")
      const page = reply["usage"] as Array<{ user: string; used: number }>
      seen.push(...page)
      pages += 1
      if (reply["more"] !== true) break
      after = page.at(-1)!.user
    }
    expect(pages).toBe(2)
    expect(seen.map((entry) => entry.user)).toEqual(expected)
    for (const entry of seen) expect(entry.used).toBe(users.indexOf(entry.user) + 1)
  })

  it("a page that ends exactly at the last user says more: false", async () => {
    const reply = await admin(
      { op: "list_usage", meter: "analysis", periodStart: monthStart(0), limit: users.length },
      partition
    )
    expect((reply["usage"] as Array<unknown>).length).toBe(users.length)
    expect(reply["more"]).toBe(false)
  })

  it("an earlier period lists what was used in it; a period with none, nothing", async () => {
    expect(
      await admin({ op: "list_usage", meter: "analysis", periodStart: monthStart(1) }, partition)
    ).toEqual({
      status: "ok",
      usage: [{ user: users[0], used: 77 }],
      more: false
    })
    expect(
      await admin({ op: "list_usage", meter: "analysis", periodStart: monthStart(30) }, partition)
    ).toEqual({
      status: "ok",
      usage: [],
      more: false
    })
  })

  it("a `none` meter lists its current value with no periodStart", async () => {
    const reply = await admin({ op: "list_usage", meter: "storage_bytes" }, partition)
    expect(reply["status"]).toBe("ok")
    expect((reply["usage"] as Array<{ user: string }>).map((entry) => entry.user)).toEqual(utf8Order(users))
  })

  it("another partition lists none of these users", async () => {
    const reply = await admin(
      { op: "list_usage", meter: "analysis", periodStart: monthStart(0) },
      partition + 1
    )
    const listed = (reply["usage"] as Array<{ user: string }>).map((entry) => entry.user)
    for (const user of users) expect(listed).not.toContain(user)
  })

  it.each([
    [{ meter: "analysis" }, "invalid_request"],
    [{ meter: "analysis", periodStart: monthStart(0) + 1 }, "invalid_request"],
    [{ meter: "analysis", periodStart: Date.UTC(2026, 0, 15) }, "invalid_request"],
    [{ meter: "analysis", periodStart: monthStart(-2) }, "invalid_request"],
    [{ meter: "analysis", periodStart: -1 }, "invalid_request"],
    [{ meter: "analysis", periodStart: "2026-01" }, "invalid_request"],
    [{ meter: "storage_bytes", periodStart: monthStart(0) }, "invalid_request"],
    [{ meter: "nope", periodStart: monthStart(0) }, "unknown_meter"],
    [{ periodStart: monthStart(0) }, "invalid_request"],
    [{ meter: "analysis", periodStart: monthStart(0), limit: 0 }, "invalid_request"],
    [{ meter: "analysis", periodStart: monthStart(0), limit: 1_001 }, "invalid_request"],
    [{ meter: "analysis", periodStart: monthStart(0), after: "" }, "invalid_request"],
    [{ meter: "analysis", periodStart: monthStart(0), after: "x".repeat(257) }, "invalid_request"],
    [{ meter: "analysis", periodStart: monthStart(0), after: 5 }, "invalid_request"],
    [{ meter: "analysis", periodStart: monthStart(0), limit: 1_000, after: "x".repeat(256) }, "ok"],
    [{ meter: "analysis", periodStart: monthStart(0), user: "ignored" }, "ok"]
  ])("list_usage %j: %s", async (fields, status) => {
    expect((await admin({ op: "list_usage", ...fields }, partition))["status"]).toBe(status)
  })

  it("is refused on .ops", async () => {
    const to = `${served.prefix}.v1.${partition}.ops`
    const reply = await nc.request(
      to,
      JSON.stringify({ op: "list_usage", meter: "analysis", periodStart: monthStart(0) })
    )
    expect(reply.json<Record<string, unknown>>()["status"]).toBe("invalid_request")
  })
})
