/**
 * Retries: `unavailable`, `overloaded`, no responders and timeouts are retried with the same command
 * (same id), until attempts run out; `busy`, `limit_reached` and service errors are answers, never retried.
 */
import { connect } from "@nats-io/transport-node"
import { Effect } from "effect"
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from "vitest"
import type { QuotaClientOptions } from "../../src/client/index.js"
import {
  QuotaClient,
  QuotaClientClosed,
  QuotaRetriesExhausted,
  QuotaServiceError,
  QuotaTransportError
} from "../../src/client/index.js"
import type { Answer, Command, MessageVerdict, ReceivedMessage } from "./fakeCoordinator.js"
import { FakeCoordinator, natsUrl, randomPrefix } from "./fakeCoordinator.js"

const prefix = randomPrefix("retry")
const partitions = 16

/** Per-test behaviour of the fake; reset after each test. */
let answer: (command: Command, attempt: number) => Answer | undefined = () => undefined
let verdict: (message: ReceivedMessage) => MessageVerdict = () => "answer"
/** Times each command id (or job) was received, counting this one. */
const attemptsById = new Map<string, number>()

let fake: FakeCoordinator
const clients: Array<QuotaClient> = []
const makeClient = async (options: QuotaClientOptions = {}) => {
  const client = await QuotaClient.connect({
    servers: natsUrl,
    prefix,
    partitions,
    timeoutMs: 1_000,
    random: () => 0.5,
    ...options,
    retry: { attemptsMax: 5, baseDelayMs: 5, delayMsMax: 20, ...options.retry }
  })
  clients.push(client)
  return client
}

beforeAll(async () => {
  fake = await FakeCoordinator.start({
    prefix,
    partitions,
    answer: (command) => {
      const name = String(command.id ?? command.job)
      const attempt = (attemptsById.get(name) ?? 0) + 1
      attemptsById.set(name, attempt)
      return answer(command, attempt)
    },
    verdict: (message) => verdict(message)
  })
})
afterEach(async () => {
  answer = () => undefined
  verdict = () => "answer"
  attemptsById.clear()
  fake.received.length = 0
  await fake.unsubscribe()
  await fake.subscribe()
  await Promise.all(clients.splice(0).map((client) => client.close()))
})
afterAll(async () => {
  await fake.stop()
})

const reserveOf = (id: string, user = "retry-user") => ({ user, meter: "analysis", amount: 5, id })
const copiesOf = (id: string) => fake.commandsReceived().filter((command) => command.id === id)

describe("retried outcomes", () => {
  it("retries unavailable with the same command until it is decided, and counts the retries", async () => {
    answer = (_command, attempt) => (attempt <= 2 ? { status: "unavailable" } : undefined)
    const client = await makeClient()
    const ids = Array.from({ length: 50 }, (_, index) => `unavailable-${index}`)
    const results = await Promise.all(
      ids.map((id, index) => client.reserve(reserveOf(id, `user-${index % 5}`)))
    )
    expect(results.map((result) => result.status)).toEqual(Array(50).fill("reserved"))
    for (const [index, id] of ids.entries()) {
      const copies = copiesOf(id)
      expect(copies).toHaveLength(3)
      expect(new Set(copies.map((copy) => JSON.stringify(copy))).size).toBe(1)
      expect(copies[0]).toEqual({ op: "reserve", ...reserveOf(id, `user-${index % 5}`) })
    }
    const counters = client.counters()
    expect(counters.retries).toBe(100)
    expect(counters.commandsSent).toBe(150)
    // Retries of a batch go back together: far fewer messages than commands.
    expect(counters.messagesSent).toBeLessThan(50)
  })

  it("retries overloaded", async () => {
    answer = (_command, attempt) => (attempt === 1 ? { status: "overloaded" } : undefined)
    const client = await makeClient()
    expect(await client.reserve(reserveOf("overloaded-1"))).toMatchObject({ status: "reserved" })
    expect(copiesOf("overloaded-1")).toHaveLength(2)
  })

  it("fails with QuotaRetriesExhausted after attemptsMax attempts", async () => {
    answer = () => ({ status: "unavailable" })
    const client = await makeClient({ retry: { attemptsMax: 3 } })
    const error = await client.reserve(reserveOf("never")).catch((e: unknown) => e)
    expect(error).toBeInstanceOf(QuotaRetriesExhausted)
    expect(error).toMatchObject({
      _tag: "QuotaRetriesExhausted",
      op: "reserve",
      attempts: 3,
      reason: "unavailable"
    })
    expect(copiesOf("never")).toHaveLength(3)
  })

  it("does not retry busy: it is the answer, with retryAfterMs", async () => {
    answer = (command) =>
      command.op === "acquire_slot" ? { status: "busy", limit: 1, held: 1, retryAfterMs: 1_234 } : undefined
    const client = await makeClient()
    expect(await client.acquireSlot({ user: "busy-user", job: "job-1" })).toMatchObject({
      status: "busy",
      retryAfterMs: 1_234
    })
    expect(fake.commandsReceived()).toHaveLength(1)
    expect(client.counters().retries).toBe(0)
  })

  it("does not retry limit_reached: a per-user bound answers the same until the caller frees something", async () => {
    answer = () => ({ status: "limit_reached", bound: "pending_holds", max: 10_000 })
    const client = await makeClient()
    expect(await client.reserve(reserveOf("bounded"))).toEqual({
      status: "limit_reached",
      bound: "pending_holds",
      max: 10_000
    })
    expect(copiesOf("bounded")).toHaveLength(1)
    expect(client.counters().retries).toBe(0)
  })

  it("does not retry invalid_request or other answers", async () => {
    answer = () => ({ status: "invalid_request", error: "amount: not an integer" })
    const client = await makeClient()
    expect(await client.reserve({ ...reserveOf("bad"), amount: 1.5 })).toEqual({
      status: "invalid_request",
      error: "amount: not an integer"
    })
    expect(copiesOf("bad")).toHaveLength(1)
  })
})

describe("transport failures", () => {
  it("retries no responders until a coordinator subscribes again", async () => {
    await fake.unsubscribe()
    const client = await makeClient({ retry: { attemptsMax: 100, baseDelayMs: 10, delayMsMax: 20 } })
    const pending = client.reserve(reserveOf("while-down"))
    await vi.waitFor(() => expect(client.counters().retries).toBeGreaterThanOrEqual(2), { timeout: 5_000 })
    await fake.subscribe()
    expect(await pending).toMatchObject({ status: "reserved", id: "while-down" })
    // Attempts while nobody subscribed reached no one: the coordinator decided the command once.
    expect(copiesOf("while-down")).toHaveLength(1)
  })

  it("fails with QuotaRetriesExhausted (no_responders) when no coordinator comes back", async () => {
    await fake.unsubscribe()
    const client = await makeClient({ retry: { attemptsMax: 2 } })
    await expect(client.reserve(reserveOf("nobody"))).rejects.toMatchObject({
      _tag: "QuotaRetriesExhausted",
      reason: "no_responders",
      attempts: 2
    })
  })

  it("retries a timed-out message with the same bytes", async () => {
    let silenced = false
    verdict = (message) => {
      if (silenced || !message.commands.some((command) => command.id === "slow")) return "answer"
      silenced = true
      return "silent"
    }
    const client = await makeClient({ timeoutMs: 300 })
    expect(await client.reserve(reserveOf("slow"))).toMatchObject({ status: "reserved" })
    const bodies = fake.received.map((message) => message.body)
    expect(bodies).toHaveLength(2)
    expect(bodies[0]).toBe(bodies[1])
    expect(client.counters().retries).toBe(1)
  })

  it("turns a 400 service error into QuotaServiceError without retrying", async () => {
    verdict = () => ({ serviceErrorCode: 400, reason: "batch of 1001 commands is over the limit" })
    const client = await makeClient()
    const error = await client.reserve(reserveOf("refused")).catch((e: unknown) => e)
    expect(error).toBeInstanceOf(QuotaServiceError)
    expect(error).toMatchObject({ code: 400, description: "batch of 1001 commands is over the limit" })
    expect(fake.received).toHaveLength(1)
    const flipped = await Effect.runPromise(Effect.flip(client.effect.reserve(reserveOf("refused-effect"))))
    expect(flipped._tag).toBe("QuotaServiceError")
  })

  it("turns a reply with the wrong number of results into QuotaTransportError", async () => {
    const brokenPrefix = randomPrefix("broken")
    const responder = await connect({ servers: natsUrl })
    responder.subscribe(`${brokenPrefix}.v1.*.ops`, {
      callback: (_error, msg) => {
        msg.respond("[]")
      }
    })
    await responder.flush()
    const client = await makeClient({ prefix: brokenPrefix })
    await expect(client.reserve(reserveOf("short-reply"))).rejects.toBeInstanceOf(QuotaTransportError)
    await responder.close()
  })
})

describe("effect flavour and close", () => {
  it("answers through client.effect", async () => {
    const client = await makeClient()
    const result = await Effect.runPromise(client.effect.reserve(reserveOf("effect-1")))
    expect(result).toMatchObject({ status: "reserved", id: "effect-1" })
  })

  it("fails commands waiting for a retry, and later calls, with QuotaClientClosed", async () => {
    answer = () => ({ status: "unavailable" })
    const client = await makeClient({ retry: { attemptsMax: 5, baseDelayMs: 5_000, delayMsMax: 5_000 } })
    const pending = client.reserve(reserveOf("closing")).catch((e: unknown) => e)
    await vi.waitFor(() => expect(client.counters().retries).toBe(1))
    await client.close()
    expect(await pending).toBeInstanceOf(QuotaClientClosed)
    await expect(client.getUsage({ user: "retry-user" })).rejects.toBeInstanceOf(QuotaClientClosed)
    const flipped = await Effect.runPromise(Effect.flip(client.effect.getUsage({ user: "retry-user" })))
    expect(flipped._tag).toBe("QuotaClientClosed")
  })
})
