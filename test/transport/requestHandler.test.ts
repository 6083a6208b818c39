/**
 * The request handler's bookkeeping of requests in flight: `interruptAll` answers every request still
 * waiting for a result, its undecided commands `unavailable`, each request once; requests already
 * answered are left alone, and results that arrive afterwards are dropped.
 */
import { Effect, Exit, Layer, Scope } from "effect"
import { describe, expect, it } from "vitest"
import type { Reply } from "../../src/actors/UserActor.js"
import { Coordinator } from "../../src/actors/Coordinator.js"
import type { Command } from "../../src/domain/commands.js"
import type { Handled, RequestTarget } from "../../src/transport/requestHandler.js"
import { makeRequestHandler } from "../../src/transport/requestHandler.js"
import { makeLogger } from "../../src/transport/log.js"

const target: RequestTarget = { subject: "test.v1.0.ops", kind: "ops", partition: 0 }
const encode = (body: unknown) => new TextEncoder().encode(JSON.stringify(body))
const usage = (user: string, ref: string) => ({ op: "get_usage", user, ref })

/** A coordinator that keeps every command and its reply callback, and answers none by itself. */
const holdingCoordinator = () => {
  const held: Array<{ command: Command; reply: Reply }> = []
  const layer = Layer.succeed(Coordinator, {
    submit: () => Effect.die(new Error("not used")),
    submitAll: () => Effect.die(new Error("not used")),
    enqueue: (command, reply) => {
      held.push({ command, reply })
    },
    listUsage: () => {
      throw new Error("not used")
    },
    sweepOnce: Effect.succeed(0),
    residentActors: () => 0,
    slotWaiters: () => 0,
    dropPartitions: () => Effect.void,
    releaseWaiters: () => Effect.void,
    dropAllActors: Effect.void
  })
  return { held, layer }
}

describe("request handler: interruptAll", () => {
  it("answers every request in flight once, its undecided commands unavailable, and drops late results", async () => {
    const { held, layer } = holdingCoordinator()
    const scope = Effect.runSync(Scope.make())
    const handler = await Effect.runPromise(
      makeRequestHandler({ logger: makeLogger("fatal"), partitions: 1 }).pipe(
        Effect.provide(layer),
        Scope.provide(scope)
      )
    )
    const answers: Array<{ request: string; handled: Handled }> = []
    const send = (request: string, body: unknown) =>
      handler.handle(target, encode(body), (handled) => answers.push({ request, handled }))

    send("first", usage("alice", "a"))
    send("batch", [usage("bob", "b1"), usage("carol", "b2"), usage("dave", "b3")])
    send("answered", usage("erin", "e"))
    send("last", usage("frank", "f"))
    expect(held.map(({ command }) => command.user)).toEqual([
      "alice",
      "bob",
      "carol",
      "dave",
      "erin",
      "frank"
    ])
    expect(handler.inFlight.total()).toBe(4)
    expect(handler.pendingRequests()).toBe(4)

    // One request finishes before the interruption; one command of the batch is decided too.
    held[4]!.reply({ status: "ok" } as never)
    held[2]!.reply({ status: "ok" } as never)
    expect(answers.map(({ request }) => request)).toEqual(["answered"])
    expect(handler.pendingRequests()).toBe(3)

    await Effect.runPromise(handler.interruptAll)
    expect(answers.map(({ request }) => request)).toEqual(["answered", "first", "batch", "last"])
    const bodyOf = (request: string) => {
      const handled = answers.find((answer) => answer.request === request)!.handled
      return "body" in handled ? JSON.parse(handled.body) : handled
    }
    expect(bodyOf("first")).toEqual({ status: "unavailable", ref: "a" })
    expect(bodyOf("batch")).toEqual([
      { status: "unavailable", ref: "b1" },
      { status: "ok", ref: "b2" },
      { status: "unavailable", ref: "b3" }
    ])
    expect(bodyOf("last")).toEqual({ status: "unavailable", ref: "f" })
    expect(handler.inFlight.total()).toBe(0)
    expect(handler.pendingRequests()).toBe(0)

    // Results arriving after the interruption, and a second interruption, answer nobody again.
    for (const { reply } of held) reply({ status: "ok" } as never)
    await Effect.runPromise(handler.interruptAll)
    expect(answers).toHaveLength(4)
    await Effect.runPromise(Scope.close(scope, Exit.void))
  })
})
