/**
 * The in-process transport runs the NATS service's code path: the same request, sent to a coordinator
 * behind the NATS server and to an identical one behind the in-process transport, gets the same reply,
 * byte for byte once the clock- and jitter-dependent fields are set aside; refused bodies get the same
 * service error headers, and a subject nothing serves rejects on both.
 */
import { randomUUID } from "node:crypto"
import { connect } from "@nats-io/transport-node"
import type { NatsConnection } from "@nats-io/transport-node"
import { Context, Effect, Exit, Layer, Scope } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { coordinatorLayer } from "../../src/actors/Coordinator.js"
import { defaultConfig } from "../../src/domain/config.js"
import { partitionOf } from "../../src/domain/partition.js"
import { memoryStoreLayer } from "../../src/store/MemoryStore.js"
import { LocalTransport, localTransportLayer } from "../../src/transport/LocalTransport.js"
import { natsServerLayer } from "../../src/transport/NatsServer.js"
import { makeLogger } from "../../src/transport/log.js"

const natsUrl = "nats://127.0.0.1:4222"
const partitions = 8

interface Answer {
  /** The Nats-Service-Error-Code header, or "" for a normal reply. */
  readonly code: string
  readonly reason: string
  readonly body: string
}

/** Sends raw bytes to a subject; a transport that has no responder rejects. */
type Send = (subject: string, body: string) => Promise<Answer>

const coordinator = () =>
  coordinatorLayer({ config: defaultConfig, partitions, sweepIntervalMs: 0 }).pipe(
    Layer.provide(memoryStoreLayer())
  )

/** Timestamps and jitter differ between two runs; everything else must not. */
const normalized = (body: string): unknown =>
  body === ""
    ? ""
    : JSON.parse(body, (key, value: unknown) =>
        typeof value === "number" && (key === "expiresAt" || key === "leaseExpiresAt")
          ? "<time>"
          : typeof value === "number" && key === "retryAfterMs"
            ? value >= 30_000 && value <= 40_000
              ? "<30-40 s>"
              : value
            : value
      )

describe("in-process transport and NATS", () => {
  const prefix = `qtdemo${randomUUID().slice(0, 8)}`
  const scope = Effect.runSync(Scope.make())
  let client: NatsConnection
  let viaNats: Send
  let viaLocal: Send

  beforeAll(async () => {
    const logger = makeLogger("silent")
    await Effect.runPromise(
      Layer.buildWithScope(
        natsServerLayer({ servers: natsUrl, prefix, partitions, logger }).pipe(Layer.provide(coordinator())),
        scope
      )
    )
    const local = Context.get(
      await Effect.runPromise(
        Layer.buildWithScope(
          localTransportLayer({ prefix, partitions, logger }).pipe(Layer.provide(coordinator())),
          scope
        )
      ),
      LocalTransport
    )
    client = await connect({ servers: natsUrl })
    viaNats = async (subject, body) => {
      const msg = await client.request(subject, body, { timeout: 10_000 })
      return {
        code: msg.headers?.get("Nats-Service-Error-Code") ?? "",
        reason: msg.headers?.get("Nats-Service-Error") ?? "",
        body: msg.string()
      }
    }
    viaLocal = async (subject, body) => {
      const reply = await local.request(subject, body)
      return {
        code: reply.headers?.["Nats-Service-Error-Code"] ?? "",
        reason: reply.headers?.["Nats-Service-Error"] ?? "",
        body: new TextDecoder().decode(reply.data)
      }
    }
  })

  afterAll(async () => {
    await client.close()
    await Effect.runPromise(Scope.close(scope, Exit.void))
  })

  const subject = (user: string, kind: "ops" | "admin" = "ops") =>
    `${prefix}.v1.${partitionOf(user, partitions)}.${kind}`

  const alice = "alice"
  const bob = "bob"
  const otherPartition = (partitionOf(alice, partitions) + 1) % partitions
  const steps: ReadonlyArray<readonly [string, string]> = [
    [
      subject(alice),
      JSON.stringify({ op: "reserve", user: alice, meter: "tokens", amount: 350_000, id: "a", ref: "r1" })
    ],
    [
      subject(alice),
      JSON.stringify({ op: "reserve", user: alice, meter: "tokens", amount: 350_000, id: "a" })
    ],
    [subject(alice), JSON.stringify({ op: "reserve", user: alice, meter: "tokens", amount: 1, id: "a" })],
    [
      subject(alice),
      JSON.stringify({ op: "reserve", user: alice, meter: "tokens", amount: 350_000, id: "b" })
    ],
    [subject(alice), JSON.stringify({ op: "reserve", user: alice, meter: "nope", amount: 1, id: "c" })],
    [
      subject(alice),
      JSON.stringify([
        { op: "consume", user: alice, id: "a", amount: 100_000, key: "k1" },
        { op: "consume", user: alice, id: "a", amount: 100_000, key: "k1" },
        { op: "commit", user: alice, id: "a", amount: 280_000, ref: "done" },
        { op: "commit", user: alice, id: "a" },
        { op: "release", user: alice, id: "a" },
        { op: "release", user: alice, id: "missing" },
        { op: "reserve", user: alice, meter: "tokens", id: "no-amount" },
        { op: "reserve", user: alice, meter: "tokens", amount: 1, id: "bad-ref", ref: 7 },
        { op: "adjust", user: alice, meter: "storage_bytes", amount: 800_000_000, id: "files" },
        { op: "adjust", user: alice, meter: "storage_bytes", amount: 800_000_000, id: "files" },
        { op: "adjust", user: alice, meter: "storage_bytes", amount: -900_000_000, id: "delete" },
        { op: "get_usage", user: bob }
      ])
    ],
    [subject(alice), JSON.stringify([])],
    [subject(alice), JSON.stringify({ op: "acquire_slot", user: alice, job: "j1" })],
    [subject(alice), JSON.stringify({ op: "acquire_slot", user: alice, job: "j2" })],
    [subject(alice), JSON.stringify({ op: "acquire_slot", user: alice, job: "j1" })],
    [subject(alice), JSON.stringify({ op: "acquire_slot", user: "", job: "system" })],
    [subject(alice), JSON.stringify({ op: "renew_slot", user: alice, job: "j1", leaseMs: 5_000 })],
    [subject(alice), JSON.stringify({ op: "release_slot", user: alice, job: "j1" })],
    [subject(alice), JSON.stringify({ op: "release_slot", user: alice, job: "j1" })],
    [subject(alice), JSON.stringify({ op: "set_plan", user: alice, plan: "pro" })],
    [subject(alice, "admin"), JSON.stringify({ op: "set_plan", user: alice, plan: "pro" })],
    [subject(alice, "admin"), JSON.stringify({ op: "set_plan", user: alice, plan: "platinum" })],
    [subject(alice, "admin"), JSON.stringify({ op: "set_limit", user: alice, meter: "tokens", limit: 10 })],
    [subject(alice), JSON.stringify({ op: "get_usage", user: alice })],
    [subject(alice, "admin"), JSON.stringify({ op: "get_usage", user: alice })],
    [`${prefix}.v1.${otherPartition}.ops`, JSON.stringify({ op: "get_usage", user: alice })],
    [subject(alice), "not json"],
    [subject(alice), "42"],
    [subject(alice), JSON.stringify(Array.from({ length: 1_001 }, () => ({ op: "get_usage", user: alice })))],
    [subject(alice), "null"]
  ]

  it("answers the same sequence of requests with the same replies", async () => {
    const codes: Array<string> = []
    for (const [to, body] of steps) {
      const nats = await viaNats(to, body)
      const local = await viaLocal(to, body)
      const step = body.slice(0, 100)
      expect({ step, code: local.code, reason: local.reason, body: normalized(local.body) }).toEqual({
        step,
        code: nats.code,
        reason: nats.reason,
        body: normalized(nats.body)
      })
      codes.push(nats.code)
    }
    // The sequence reaches both kinds of answer: results, and the 400 of a body that is no command.
    expect(codes.filter((code) => code === "400")).toHaveLength(4)
    expect(codes.filter((code) => code === "")).toHaveLength(steps.length - 4)
  })

  it("gives identical bodies byte for byte when no clock is involved", async () => {
    const body = JSON.stringify([
      { op: "adjust", user: bob, meter: "analysis", amount: 4_985, id: "used", ref: "x" },
      { op: "get_usage", user: bob },
      { op: "release", user: bob, id: "none" },
      { op: "reserve", user: bob, meter: "analysis", amount: 16, id: "too-much" }
    ])
    const [nats, local] = [await viaNats(subject(bob), body), await viaLocal(subject(bob), body)]
    expect(local).toEqual(nats)
    expect(nats.code).toBe("")
  })

  it("rejects a subject nothing serves on both", async () => {
    const unserved = `${prefix}.v1.${partitions}.ops`
    await expect(viaNats(unserved, "{}")).rejects.toThrow()
    await expect(viaLocal(unserved, "{}")).rejects.toThrow(/no responders/)
  })
})
