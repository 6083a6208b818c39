/**
 * How the actor answers when things go wrong around a group: every command exactly once, with its real
 * result where it has one, and in arrival order.
 */
import { Effect } from "effect"
import { describe, expect, it } from "vitest"
import { Coordinator } from "../../src/actors/Coordinator.js"
import type { Command } from "../../src/domain/commands.js"
import type { StoreEvent } from "../../src/domain/events.js"
import type { Result } from "../../src/domain/results.js"
import { makeMemoryStore } from "../../src/store/MemoryStore.js"
import { runOnCoordinator } from "../support/harness.js"

/** A memory store whose writes mentioning a hold id in `held` wait for `release`, and in `failing` fail. */
const controlledStore = () => {
  const held = new Set<string>()
  const failing = new Set<string>()
  const waiting = new Map<string, () => void>()
  const holdIds = (events: ReadonlyArray<StoreEvent>) =>
    events.flatMap((event) => (event.kind === "hold" ? [event.hold.id] : []))
  const store = makeMemoryStore({
    beforeWrite: async (events) => {
      for (const id of holdIds(events)) {
        if (held.has(id)) await new Promise<void>((resolve) => waiting.set(id, resolve))
        if (failing.has(id)) throw new Error(`the write of ${id} fails`)
      }
    }
  })
  return { store, held, failing, release: (id: string) => waiting.get(id)?.() }
}

const run = <A>(store: ReturnType<typeof makeMemoryStore>, body: Effect.Effect<A, never, Coordinator>) =>
  runOnCoordinator(store, body)

const reserve = (id: string): Command => ({
  op: "reserve",
  user: "u",
  meter: "tokens",
  amount: 1,
  id,
  ttlMs: 60_000
})
const acquire = (job: string): Command => ({
  op: "acquire_slot",
  user: "u",
  job,
  leaseMs: 60_000,
  waitMs: 60_000
})
/** Real time for the memory store's promises and the actor's fibers to move on. */
const settle = Effect.promise(() => new Promise((resolve) => setTimeout(resolve, 20)))

/** Records every answer each command gets, by name. */
const recorder = () => {
  const answers: Record<string, Array<string>> = {}
  const order: Array<string> = []
  const record =
    (name: string) =>
    (result: Result): void => {
      ;(answers[name] ??= []).push(result.status)
      order.push(`${name}:${result.status}`)
    }
  return { answers, order, record }
}

describe("answers around a failed, interrupted or throwing group", () => {
  it("answers a parked acquire_slot once when its group's write fails", async () => {
    const control = controlledStore()
    const { answers, record } = recorder()
    await run(
      control.store,
      Effect.gen(function* () {
        const coordinator = yield* Coordinator
        // The free plan has one slot: j0 takes it, so j1 parks.
        yield* coordinator.submit(acquire("j0"))
        yield* settle
        // r0's write is held, so j1 and r1 queue behind it and are decided as one group, which fails.
        control.held.add("r0")
        control.failing.add("r1")
        coordinator.enqueue(reserve("r0"), record("r0"))
        coordinator.enqueue(acquire("j1"), record("j1"))
        coordinator.enqueue(reserve("r1"), record("r1"))
        yield* settle
        control.release("r0")
        yield* settle
      })
    )
    expect(answers).toEqual({ r0: ["reserved"], j1: ["unavailable"], r1: ["unavailable"] })
  })

  it("a dropped actor answers what it held once each, in arrival order", async () => {
    const control = controlledStore()
    const { answers, order, record } = recorder()
    await run(
      control.store,
      Effect.gen(function* () {
        const coordinator = yield* Coordinator
        yield* coordinator.submit(acquire("j0"))
        yield* settle
        control.held.add("r1")
        coordinator.enqueue(acquire("j1"), record("j1")) // decided alone (nothing to write): parks
        coordinator.enqueue(reserve("r1"), record("r1")) // the next group; its write is held
        coordinator.enqueue(reserve("r2"), record("r2")) // queued behind it
        yield* settle
        // Dropped (as a hand-off or a simulated crash does) while the group's write waits.
        yield* coordinator.dropAllActors
        control.release("r1")
        yield* settle
      })
    )
    expect(order).toEqual(["j1:unavailable", "r1:unavailable", "r2:unavailable"])
    expect(answers).toEqual({ j1: ["unavailable"], r1: ["unavailable"], r2: ["unavailable"] })
  })

  it("a reply callback that throws costs nobody else their answer", async () => {
    const control = controlledStore()
    const { answers, record } = recorder()
    const errors: Array<string> = []
    await runOnCoordinator(
      control.store,
      Effect.gen(function* () {
        const coordinator = yield* Coordinator
        yield* coordinator.submit(reserve("r"))
        yield* settle
        control.held.add("r0")
        coordinator.enqueue(reserve("r0"), record("r0"))
        coordinator.enqueue(reserve("a"), record("a"))
        coordinator.enqueue(reserve("b"), (result) => {
          record("b")(result)
          throw new Error("a caller's bug")
        })
        coordinator.enqueue(reserve("c"), record("c"))
        yield* settle
        control.release("r0")
        yield* settle
      }),
      { onError: (_, message) => errors.push(message) }
    )
    expect(answers).toEqual({ r0: ["reserved"], a: ["reserved"], b: ["reserved"], c: ["reserved"] })
    expect(errors).toEqual(["reply callback threw"])
  })
})
