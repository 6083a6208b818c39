/**
 * The request handler keeps nothing of a request but its reply being assembled: each command goes to
 * its partition's actor with the partition the subject named, the reply leaves when the last result
 * arrives, in the message's order whatever order the results came in, and a second result for the
 * same command is dropped. What answers a command that is never decided is the partition actor that
 * holds it (test/actors/coordinator.test.ts, "dropping partitions").
 */
import { Effect, Exit, Layer, Scope } from "effect"
import { describe, expect, it } from "vitest"
import type { Reply } from "../../src/actors/replies.js"
import { Coordinator } from "../../src/actors/Coordinator.js"
import type { Command } from "../../src/domain/commands.js"
import type { Handled, RequestTarget } from "../../src/transport/requestHandler.js"
import { makeRequestHandler } from "../../src/transport/requestHandler.js"
import { makeLogger } from "../../src/transport/log.js"

const target: RequestTarget = { subject: "test.v1.0.ops", kind: "ops", partition: 0 }
const encode = (body: unknown) => new TextEncoder().encode(JSON.stringify(body))
const usage = (user: string, ref: string) => ({ op: "get_usage", user, ref })

/** A coordinator that keeps every command, its partition and its reply callback, and answers none itself. */
const holdingCoordinator = () => {
  const held: Array<{ partition: number; command: Command; reply: Reply }> = []
  const layer = Layer.succeed(Coordinator, {
    submit: () => Effect.die(new Error("not used")),
    submitAll: () => Effect.die(new Error("not used")),
    enqueue: () => {
      throw new Error("not used: the transport names the partition")
    },
    enqueueIn: (partition, command, reply) => {
      held.push({ partition, command, reply })
    },
    listUsage: () => {
      throw new Error("not used")
    },
    sweepOnce: Effect.succeed(0),
    whenOpened: () => Effect.void,
    residentActors: () => 0,
    slotWaiters: () => 0,
    dropPartitions: () => Effect.void,
    drainPartitions: () => Effect.succeed(true),
    dropAllActors: Effect.void
  })
  return { held, layer }
}

describe("request handler", () => {
  it("hands each command over with the subject's partition and answers each request once, in the message's order", async () => {
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
    expect(held.map(({ command, partition }) => `${command.user}@${partition}`)).toEqual([
      "alice@0",
      "bob@0",
      "carol@0",
      "dave@0"
    ])

    // Results out of order, one of them twice: the batch answers when its last arrives.
    held[3]!.reply({ status: "unavailable" })
    held[2]!.reply({ status: "ok" } as never)
    held[2]!.reply({ status: "unavailable" })
    expect(answers).toEqual([])
    held[1]!.reply({ status: "ok" } as never)
    held[0]!.reply({ status: "ok" } as never)
    held[0]!.reply({ status: "ok" } as never)
    expect(answers.map(({ request }) => request)).toEqual(["batch", "first"])
    const bodyOf = (request: string) => {
      const handled = answers.find((answer) => answer.request === request)!.handled
      if (!("body" in handled)) throw new Error(`${request}: a service error`)
      // The byte length the NATS edge checks against the max payload is the body's.
      expect(handled.bytes).toBe(Buffer.byteLength(handled.body))
      return JSON.parse(handled.body) as unknown
    }
    expect(bodyOf("first")).toEqual({ status: "ok", ref: "a" })
    expect(bodyOf("batch")).toEqual([
      { status: "ok", ref: "b1" },
      { status: "ok", ref: "b2" },
      { status: "unavailable", ref: "b3" }
    ])
    await Effect.runPromise(Scope.close(scope, Exit.void))
  })
})
