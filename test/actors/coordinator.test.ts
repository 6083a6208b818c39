import { Effect, Fiber } from "effect"
import { TestClock } from "effect/testing"
import { describe, expect, it } from "vitest"
import { Coordinator } from "../../src/actors/Coordinator.js"
import { makeMemoryStore } from "../../src/store/MemoryStore.js"
import { runOnCoordinator } from "../support/harness.js"

const run = <A>(body: Effect.Effect<A, never, Coordinator>, store = makeMemoryStore()) =>
  runOnCoordinator(store, body)

describe("Coordinator", () => {
  it("grants exactly one of two concurrent reserves that only one fits (seed 000)", async () => {
    const store = makeMemoryStore()
    const results = await run(
      Effect.gen(function* () {
        const coordinator = yield* Coordinator
        yield* coordinator.submit({ op: "adjust", user: "u", meter: "analysis", amount: 4_985, id: "seed" })
        return yield* Effect.all(
          [
            coordinator.submit({
              op: "reserve",
              user: "u",
              meter: "analysis",
              amount: 10,
              id: "a",
              ttlMs: 60_000
            }),
            coordinator.submit({
              op: "reserve",
              user: "u",
              meter: "analysis",
              amount: 10,
              id: "b",
              ttlMs: 60_000
            })
          ],
          { concurrency: "unbounded" }
        )
      }),
      store
    )
    expect(results.map((result) => result.status).sort()).toEqual(["insufficient_quota", "reserved"])
  })

  it("expires a hold on the clock and gives a waiter the freed slot", async () => {
    const outcome = await run(
      Effect.gen(function* () {
        const coordinator = yield* Coordinator
        yield* coordinator.submit({
          op: "reserve",
          user: "u",
          meter: "tokens",
          amount: 100,
          id: "h",
          ttlMs: 1_000
        })
        yield* coordinator.submit({ op: "acquire_slot", user: "u", job: "j1", leaseMs: 5_000, waitMs: 0 })
        const waiter = yield* Effect.forkChild(
          coordinator.submit({ op: "acquire_slot", user: "u", job: "j2", leaseMs: 5_000, waitMs: 60_000 })
        )
        yield* TestClock.adjust(2_000)
        const usage = yield* coordinator.submit({ op: "get_usage", user: "u" })
        yield* TestClock.adjust(4_000)
        const granted = yield* Fiber.join(waiter)
        return { usage, granted }
      })
    )
    expect(outcome.granted).toMatchObject({ status: "acquired", job: "j2", held: 1, limit: 1 })
    expect(outcome.usage).toMatchObject({ status: "ok" })
    if (outcome.usage.status === "ok" && "meters" in outcome.usage) {
      expect(outcome.usage.meters.find((meter) => meter.meter === "tokens")).toMatchObject({
        reserved: 0,
        used: 0
      })
    }
  })

  it("answers unavailable when the actor itself crashes outside a decision, then serves from the store", async () => {
    let crashes = 1
    const results = await runOnCoordinator(
      makeMemoryStore(),
      Effect.gen(function* () {
        const coordinator = yield* Coordinator
        const reserve = (id: string) =>
          coordinator.submit({ op: "reserve", user: "u", meter: "tokens", amount: 10, id, ttlMs: 60_000 })
        // The first write is durable, then the actor's own code throws before it answers.
        const crashed = yield* reserve("a")
        const retried = yield* reserve("a")
        return { crashed, retried }
      }),
      {
        onPersisted: () => {
          if (crashes > 0) {
            crashes -= 1
            throw new Error("a bug after the write")
          }
        }
      }
    )
    expect(results.crashed).toEqual({ status: "unavailable" })
    // The write had landed: the retry of the same id finds the hold the store kept.
    expect(results.retried).toMatchObject({ status: "exists", id: "a", amount: 10 })
  })
})
