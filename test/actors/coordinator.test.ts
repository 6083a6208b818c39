import { Effect, Fiber } from "effect"
import { TestClock } from "effect/testing"
import { describe, expect, it } from "vitest"
import { Coordinator } from "../../src/actors/Coordinator.js"
import type { Command } from "../../src/domain/commands.js"
import { defaultConfig } from "../../src/domain/config.js"
import { partitionsDefault } from "../../src/domain/limits.js"
import { partitionOf } from "../../src/domain/partition.js"
import { makeMemoryStore } from "../../src/store/MemoryStore.js"
import { runOnCoordinator, startCoordinator } from "../support/harness.js"

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

describe("Coordinator: which actors stay resident", () => {
  /** A memory store that records every load, so a test sees which users had to be loaded again. */
  const countingStore = () => {
    const loads: Array<string> = []
    const store = makeMemoryStore({
      beforeLoad: async (user) => {
        loads.push(user)
      }
    })
    return { store, loads }
  }
  const usage = (user: string): Command => ({ op: "get_usage", user })

  it("evicts the least recently used actor when the resident cap is reached, not the first one made", async () => {
    const { store, loads } = countingStore()
    const harness = await startCoordinator({ config: defaultConfig, store, residentActorsMax: 2 })
    try {
      for (const user of ["a", "b", "a", "c"]) await harness.send(usage(user))
      expect(harness.coordinator.residentActors()).toBe(2)
      expect(loads).toEqual(["a", "b", "c"])
      // `a` was used after `b`, so `b` made room for `c`: `a` answers from memory, `b` is loaded again.
      await harness.send(usage("a"))
      expect(loads).toEqual(["a", "b", "c"])
      await harness.send(usage("b"))
      expect(loads).toEqual(["a", "b", "c", "b"])
    } finally {
      await harness.close()
    }
  })

  it("evicts an idle actor behind an older one whose timer tick was decided more recently", async () => {
    const { store, loads } = countingStore()
    const idleMs = 4_000
    const harness = await startCoordinator({ config: defaultConfig, store, actorIdleMs: idleMs })
    try {
      // `a` is used first and `b` after it; `a`'s hold expires at 1 s, a tick that `a` decides then.
      await harness.send({ op: "reserve", user: "a", meter: "tokens", amount: 10, id: "h", ttlMs: 1_000 })
      await harness.send(usage("b"))
      await harness.advance(1_000)
      await harness.send(usage("c"))
      // At 4.5 s `b` has been idle past idleMs; `a` (ticked at 1 s) and `c` (used at 1 s) have not.
      await harness.advance(3_500)
      expect(harness.coordinator.residentActors()).toBe(2)
      await harness.send(usage("a"))
      await harness.send(usage("b"))
      expect(loads).toEqual(["a", "b", "c", "b"])
    } finally {
      await harness.close()
    }
  })
})

describe("Coordinator: waiters when a partition stops being served", () => {
  const user = "u"
  /** Lets the actors' fibers and the store's promises run. */
  const settle = Effect.promise(() => new Promise<void>((resolve) => setTimeout(resolve, 20)))

  it("drainPartitions answers the waiter unavailable, lets the batch in flight and the queue be decided, then reports the partition drained", async () => {
    let openGate: () => void = () => {}
    let gated = false
    const store = makeMemoryStore({
      beforeWrite: () => (gated ? new Promise<void>((resolve) => (openGate = resolve)) : Promise.resolve())
    })
    const answers = await runOnCoordinator(
      store,
      Effect.gen(function* () {
        const coordinator = yield* Coordinator
        const answers: Array<string> = []
        const record = (label: string) => (result: { status: string }) =>
          answers.push(`${label} ${result.status}`)
        yield* coordinator.submit({ op: "acquire_slot", user, job: "j1", leaseMs: 60_000, waitMs: 0 })
        gated = true
        coordinator.enqueue(
          { op: "acquire_slot", user, job: "j2", leaseMs: 60_000, waitMs: 60_000 },
          record("j2")
        )
        coordinator.enqueue(
          { op: "reserve", user, meter: "tokens", amount: 5, id: "h", ttlMs: 60_000 },
          record("h")
        )
        yield* settle
        expect(answers).toEqual([])
        const partition = partitionOf(user, partitionsDefault)
        const drained = yield* Effect.forkChild(coordinator.drainPartitions([partition], 60_000))
        // Enqueued after the call, while the write is in flight: decided before the drain ends.
        coordinator.enqueue(
          { op: "reserve", user, meter: "tokens", amount: 5, id: "h2", ttlMs: 60_000 },
          record("h2")
        )
        yield* settle
        expect(answers).toEqual([])
        gated = false
        openGate()
        answers.push(`drained ${yield* Fiber.join(drained)}`)
        yield* coordinator.dropPartitions([partition])
        answers.push(`resident ${coordinator.residentActors()}`)
        return answers
      })
    )
    // The waiter is answered once the batch that parked it is durable, not after its whole wait.
    expect(answers).toEqual(["h reserved", "j2 unavailable", "h2 reserved", "drained true", "resident 0"])
  })

  it("a user not servable here is answered unavailable without loading it, and no actor stays", async () => {
    const loads: Array<string> = []
    const store = makeMemoryStore({
      beforeLoad: async (loaded) => {
        loads.push(loaded)
      }
    })
    const outcome = await runOnCoordinator(
      store,
      Effect.gen(function* () {
        const coordinator = yield* Coordinator
        const result = yield* coordinator.submit({ op: "get_usage", user })
        return { result, resident: coordinator.residentActors() }
      }),
      { servingEpoch: () => undefined }
    )
    expect(outcome).toEqual({ result: { status: "unavailable" }, resident: 0 })
    expect(loads).toEqual([])
  })

  it("an actor that may no longer decide answers its waiters unavailable at their next tick", async () => {
    let servable = true
    const answers = await runOnCoordinator(
      makeMemoryStore(),
      Effect.gen(function* () {
        const coordinator = yield* Coordinator
        const answers: Array<string> = []
        yield* coordinator.submit({ op: "acquire_slot", user, job: "j1", leaseMs: 60_000, waitMs: 0 })
        coordinator.enqueue(
          { op: "acquire_slot", user, job: "j2", leaseMs: 60_000, waitMs: 10_000 },
          (result) => answers.push(`j2 ${result.status}`)
        )
        yield* settle
        servable = false
        // The waiter's wait ends: its tick reaches an actor whose memory may be stale.
        yield* TestClock.adjust(10_000)
        yield* settle
        answers.push(`resident ${coordinator.residentActors()}`)
        return answers
      }),
      { servingEpoch: () => (servable ? 0 : undefined) }
    )
    expect(answers).toEqual(["j2 unavailable", "resident 0"])
  })
})
