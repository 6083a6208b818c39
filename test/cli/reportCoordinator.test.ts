/**
 * `quota-coordinator report` against the real coordinator (PROTOCOL.md revision 1.3's `list_usage`):
 * every user of every partition with the figures `get_usage` and the `usage_recorded` events give, in
 * partition then UTF-8 byte order, across pages of 2 with non-ASCII users; a `day` and a `none`
 * meter; exit 1 on `unknown_meter` and 2 on a PERIOD that is not one of the meter's periods. The
 * README's billing claim is checked too: the events' sums per user, meter and period are the report.
 */
import { spawn } from "node:child_process"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { runCli } from "../../src/cli/cli.js"
import type { QuotaClient } from "../../src/client/QuotaClient.js"
import type { QuotaEventMessage } from "../../src/client/index.js"
import { billingUsers, dayStart, monthStart, reportOrder, writeBillingConfig } from "../support/billing.js"
import type { ServedCoordinator } from "../support/operations.js"
import { startServedCoordinator } from "../support/operations.js"

const partitions = 64
let served: ServedCoordinator
let client: QuotaClient
let users: ReadonlyArray<string>
/** Each user's `used` of tokens this month: a consume of 60, then a commit that charges or refunds. */
const tokensUsed = new Map<string, number>()
const rendersUsed = new Map<string, number>()
const storageUser = () => users[0]!
const storageUsed = 4_000
/** The usage_recorded events the workload records: 2 per user for tokens, 1 for renders, 2 for storage. */
const eventsExpected = () => users.length * 3 + 2
const startedAt = Date.now()
const month = monthStart(startedAt)
const isoMonth = new Date(month).toISOString().slice(0, 7)
const isoDay = new Date(dayStart(startedAt)).toISOString().slice(0, 10)

interface Ran {
  readonly code: number
  readonly stdout: string
  readonly stderr: string
}

const report = async (args: ReadonlyArray<string>): Promise<Ran> => {
  let stdout = ""
  let stderr = ""
  const code = await runCli(["report", ...args], {
    env: { ...process.env, NATS_URL: served.natsUrl, QUOTA_PREFIX: served.prefix },
    stdout: (text) => (stdout += text),
    stderr: (text) => (stderr += text)
  })
  return { code, stdout, stderr }
}

const csvOf = (meter: string, period: string, used: ReadonlyMap<string, number>): string =>
  "user,meter,periodStart,used\r\n" +
  [...used.keys()]
    .sort(reportOrder(partitions))
    .map((user) => `${user},${meter},${period},${used.get(user)}\r\n`)
    .join("")

beforeAll(async () => {
  served = await startServedCoordinator("report", { QUOTA_CONFIG: await writeBillingConfig() })
  client = served.client
  users = billingUsers(served.prefix, partitions)
  await Promise.all(
    users.map(async (user, index) => {
      const used = index % 2 === 0 ? 61 + index : 20 + index
      expect((await client.reserve({ user, meter: "tokens", amount: 100, id: "job" })).status).toBe(
        "reserved"
      )
      expect((await client.consume({ user, id: "job", amount: 60, key: "k1" })).status).toBe("consumed")
      expect((await client.commit({ user, id: "job", amount: used })).status).toBe("committed")
      tokensUsed.set(user, used)
      expect((await client.adjust({ user, meter: "renders", amount: index + 1, id: "r" })).status).toBe(
        "adjusted"
      )
      rendersUsed.set(user, index + 1)
    })
  )
  const user = storageUser()
  expect((await client.adjust({ user, meter: "storage_bytes", amount: 5_000, id: "s1" })).status).toBe(
    "adjusted"
  )
  expect((await client.adjust({ user, meter: "storage_bytes", amount: -1_000, id: "s2" })).status).toBe(
    "adjusted"
  )
}, 60_000)

afterAll(() => served?.close())

describe("quota-coordinator report against the coordinator", () => {
  it("lists every user's tokens of this month in partition and UTF-8 byte order, across pages of 2", async () => {
    const ran = await report(["tokens", isoMonth, "--page-size", "2"])
    expect(ran).toEqual({ code: 0, stdout: csvOf("tokens", `${isoMonth}-01`, tokensUsed), stderr: "" })
    // The same with the default page size, and the figures get_usage gives.
    expect((await report(["tokens", isoMonth])).stdout).toBe(ran.stdout)
    for (const user of users) {
      const usage = await client.getUsage({ user })
      expect(
        usage.status === "ok" ? usage.meters.find((meter) => meter.meter === "tokens")?.used : usage
      ).toBe(tokensUsed.get(user))
    }
  })

  it("gives, as JSON lines, the sums of the usage_recorded events per user, meter and period", async () => {
    const subscription = await client.events({ kinds: ["usage_recorded"] })
    const received: Array<QuotaEventMessage> = []
    const deadline = setTimeout(() => void subscription.stop(), 20_000)
    for await (const delivery of subscription) {
      received.push(delivery.event)
      delivery.ack()
      if (received.length === eventsExpected()) break
    }
    clearTimeout(deadline)
    await subscription.stop()
    expect(received).toHaveLength(eventsExpected())
    const sums = new Map<string, number>()
    for (const event of received)
      if (event.event === "usage_recorded" && event.meter === "tokens" && event.periodStart === month)
        sums.set(event.user, (sums.get(event.user) ?? 0) + event.amount)
    const ran = await report(["tokens", isoMonth, "--format", "jsonl", "--page-size", "3"])
    expect(ran.code).toBe(0)
    const rows = ran.stdout
      .trimEnd()
      .split("\n")
      .map((line) => JSON.parse(line) as { user: string; meter: string; periodStart: number; used: number })
    expect(rows.every((row) => row.meter === "tokens" && row.periodStart === month)).toBe(true)
    expect(new Map(rows.map((row) => [row.user, row.used]))).toEqual(sums)
    expect(sums).toEqual(tokensUsed)
  })

  it("lists a day meter's day and a none meter's current value (PERIOD - or omitted)", async () => {
    expect((await report(["renders", isoDay])).stdout).toBe(csvOf("renders", isoDay, rendersUsed))
    const gauge = new Map([[storageUser(), storageUsed]])
    expect(await report(["storage_bytes"])).toEqual({
      code: 0,
      stdout: csvOf("storage_bytes", "", gauge),
      stderr: ""
    })
    expect((await report(["storage_bytes", "-"])).stdout).toBe(csvOf("storage_bytes", "", gauge))
  })

  it("exits 1 on unknown_meter with nothing on stdout", async () => {
    const ran = await report(["nope", isoMonth])
    expect(ran.code).toBe(1)
    expect(ran.stdout).toBe("")
    expect(ran.stderr).toMatch(
      /^unknown_meter: the coordinator's configuration has no meter "nope" \(partition 0\)\n$/
    )
  })

  it("exits 2 on a PERIOD that is not one of the meter's periods, or later than the current one", async () => {
    const nextMonth = new Date(
      Date.UTC(new Date(month).getUTCFullYear(), new Date(month).getUTCMonth() + 1, 1)
    )
    for (const args of [
      ["tokens"],
      ["tokens", `${isoMonth}-02`],
      ["tokens", nextMonth.toISOString().slice(0, 7)],
      ["storage_bytes", isoMonth]
    ]) {
      const ran = await report(args)
      expect(ran.code, args.join(" ")).toBe(2)
      expect(ran.stdout, args.join(" ")).toBe("")
      expect(ran.stderr, args.join(" ")).toMatch(/^invalid_request: .+ \(partition 0\)\n$/)
    }
  })

  it("as a program, writes the same CSV through a pipe and exits 0", async () => {
    const ran = await new Promise<{ code: number | null; stdout: string }>((resolve, reject) => {
      const child = spawn(
        process.execPath,
        ["--import", "tsx", "src/cli/main.ts", "report", "tokens", isoMonth, "--page-size", "1"],
        {
          env: { ...process.env, NATS_URL: served.natsUrl, QUOTA_PREFIX: served.prefix },
          stdio: ["ignore", "pipe", "inherit"]
        }
      )
      let stdout = ""
      child.stdout.on("data", (chunk: Buffer) => (stdout += chunk.toString()))
      child.once("error", reject)
      child.once("exit", (code) => resolve({ code, stdout }))
    })
    expect(ran).toEqual({ code: 0, stdout: csvOf("tokens", `${isoMonth}-01`, tokensUsed) })
  }, 30_000)
})
