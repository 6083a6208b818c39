/**
 * Coalescing: concurrent commands for one partition and subject kind share a batch message, results
 * come back to their callers by array position, and the batch size limit starts further messages.
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest"
import { QuotaClient } from "../../src/client/index.js"
import { partitionOf } from "../../src/domain/partition.js"
import type { Answer, Command } from "./fakeCoordinator.js"
import { FakeCoordinator, natsUrl, randomPrefix } from "./fakeCoordinator.js"

const prefix = randomPrefix("coalesce")
const partitions = 64
/** How long the fake takes to answer, so that a message is in flight while more commands arrive. */
let replyDelayMs = 0
/** Echoes the command's id and amount, so a result given to the wrong caller is seen. */
const echo = (command: Command): Answer | undefined =>
  command.op === "reserve" ? { status: "reserved", id: command.id, amount: command.amount } : undefined

let fake: FakeCoordinator
const clients: Array<QuotaClient> = []
const makeClient = async (options: { batchCommandsMax?: number; timeoutMs?: number } = {}) => {
  const client = await QuotaClient.connect({ servers: natsUrl, prefix, partitions, ...options })
  clients.push(client)
  return client
}

beforeAll(async () => {
  fake = await FakeCoordinator.start({
    prefix,
    partitions,
    answer: echo,
    replyDelayMs: (message) =>
      message.commands.some((command) => command.op === "acquire_slot") ? 400 : replyDelayMs
  })
})
afterEach(async () => {
  fake.received.length = 0
  replyDelayMs = 0
  await Promise.all(clients.splice(0).map((client) => client.close()))
})
afterAll(async () => {
  await fake.stop()
})

const usersOver = (count: number) => Array.from({ length: count }, (_, index) => `coalesce-user-${index}`)

describe("coalescing", () => {
  it("sends a burst of 500 reserves as one message per partition, each result to its own caller", async () => {
    const client = await makeClient()
    const users = usersOver(6)
    const partitionsUsed = new Set(users.map((user) => partitionOf(user, partitions)))
    const results = await Promise.all(
      Array.from({ length: 500 }, (_, index) =>
        client.reserve({
          user: users[index % users.length]!,
          meter: "analysis",
          amount: index,
          id: `hold-${index}`,
          ref: `ref-${index}`
        })
      )
    )
    results.forEach((result, index) => {
      expect(result).toMatchObject({
        status: "reserved",
        id: `hold-${index}`,
        amount: index,
        ref: `ref-${index}`
      })
    })
    expect(fake.received).toHaveLength(partitionsUsed.size)
    expect(fake.commandsReceived()).toHaveLength(500)
    expect(client.counters()).toEqual({ messagesSent: partitionsUsed.size, commandsSent: 500, retries: 0 })
    for (const message of fake.received) {
      expect(message.subject).toBe(`${prefix}.v1.${message.partition}.ops`)
    }
  })

  it("accumulates the next batch while a message is in flight", async () => {
    replyDelayMs = 50
    const client = await makeClient()
    const users = usersOver(3)
    const pending: Array<Promise<unknown>> = []
    for (let index = 0; index < 500; index += 1) {
      const user = users[index % users.length]!
      pending.push(client.reserve({ user, meter: "analysis", amount: 1, id: `staggered-${index}` }))
      // One call per macrotask: without accumulation each would go in a message of its own.
      await new Promise((resolve) => setImmediate(resolve))
    }
    const results = (await Promise.all(pending)) as Array<{ id: string }>
    expect(results.map((result) => result.id)).toEqual(
      Array.from({ length: 500 }, (_, i) => `staggered-${i}`)
    )
    expect(fake.received.length).toBeLessThan(50)
    expect(fake.received.length).toBe(client.counters().messagesSent)
  })

  it("starts another message when a batch reaches batchCommandsMax", async () => {
    replyDelayMs = 20
    const client = await makeClient({ batchCommandsMax: 100 })
    const results = await Promise.all(
      Array.from({ length: 450 }, (_, index) =>
        client.reserve({ user: "one-user", meter: "analysis", amount: 1, id: `capped-${index}` })
      )
    )
    expect(results.every((result, index) => "id" in result && result.id === `capped-${index}`)).toBe(true)
    expect(fake.received.map((message) => message.commands.length)).toEqual([100, 100, 100, 100, 50])
  })

  it("with batchCommandsMax 1 sends one message per command", async () => {
    const client = await makeClient({ batchCommandsMax: 1 })
    await Promise.all(
      Array.from({ length: 20 }, (_, index) =>
        client.reserve({ user: "one-user", meter: "analysis", amount: 1, id: `single-${index}` })
      )
    )
    expect(fake.received).toHaveLength(20)
    expect(client.counters().messagesSent).toBe(20)
  })

  it("keeps ops and admin commands of one partition in separate messages on their own subjects", async () => {
    const client = await makeClient()
    const [usage, plan, limit] = await Promise.all([
      client.getUsage({ user: "admin-user" }),
      client.setPlan({ user: "admin-user", plan: "pro" }),
      client.setLimit({ user: "admin-user", meter: "analysis", limit: null })
    ])
    expect([usage.status, plan.status, limit.status]).toEqual(["ok", "ok", "ok"])
    const partition = partitionOf("admin-user", partitions)
    const byKind = Object.fromEntries(
      fake.received.map((message) => [message.kind, message.commands.map((c) => c.op)])
    )
    expect(byKind).toEqual({ ops: ["get_usage"], admin: ["set_plan", "set_limit"] })
    expect(fake.received.map((message) => message.partition)).toEqual([partition, partition])
    expect(fake.commandsReceived().find((command) => command.op === "set_limit")).toHaveProperty(
      "limit",
      null
    )
  })

  it("sends an acquire_slot that waits alone, with its wait added to the reply timeout", async () => {
    const client = await makeClient({ timeoutMs: 150 })
    const user = "waiting-user"
    const [slot, ...reserves] = await Promise.all([
      client.acquireSlot({ user, job: "job-1", waitMs: 500 }),
      ...Array.from({ length: 5 }, (_, index) =>
        client.reserve({ user, meter: "analysis", amount: 1, id: `beside-${index}` })
      )
    ])
    expect(slot.status).toBe("acquired")
    expect(reserves.map((result) => result.status)).toEqual(Array(5).fill("reserved"))
    const acquireMessage = fake.received.find((message) => message.commands[0]?.op === "acquire_slot")
    expect(acquireMessage?.commands).toHaveLength(1)
    // The fake answers the acquire after 400 ms, past timeoutMs: only the wait's extra time saves it.
    expect(client.counters().retries).toBe(0)
  })

  it("routes every user to the partition the coordinator computes (fnv1a32 mod P)", async () => {
    const client = await makeClient()
    const users = ["", "a", "ü-user", "日本語", "x".repeat(256)]
    const results = await Promise.all(users.map((user) => client.releaseSlot({ user, job: "j" })))
    expect(results.map((result) => result.status)).not.toContain("wrong_partition")
    expect(client.subjectOf("a")).toBe(`${prefix}.v1.${partitionOf("a", partitions)}.ops`)
    expect(client.subjectOf("a", "admin")).toBe(`${prefix}.v1.${partitionOf("a", partitions)}.admin`)
  })
})
