/**
 * An actor decides only from memory loaded under the epoch it is serving now (issue 26, items 2 and 3).
 * - Item 2: the partition was lost and claimed again while the actor stayed resident (its step-down
 *   still running): its memory is from before the claim, so it must not decide from it, and its writes
 *   carry the epoch they were decided under.
 * - Item 3: the recall of forgotten ids yields to the store; the partition lost meanwhile, a group that
 *   writes nothing must not be answered from memory.
 */
import { Effect, Fiber } from "effect"
import { describe, expect, it } from "vitest"
import { Coordinator } from "../../src/actors/Coordinator.js"
import type { StoreEvent } from "../../src/domain/events.js"
import { makeMemoryStore } from "../../src/store/MemoryStore.js"
import type { StoreShape } from "../../src/store/Store.js"
import { runOnCoordinator } from "../support/harness.js"

const user = "stale-epoch-user"
const settle = Effect.promise(() => new Promise<void>((resolve) => setTimeout(resolve, 20)))

/** Events as the other owner's actor writes them: a pending hold of `amount` on analysis. */
const pendingHold = (id: string, amount: number, at: number): StoreEvent => ({
  kind: "hold",
  user,
  hold: {
    id,
    meter: "analysis",
    amount,
    consumed: 0,
    state: "pending",
    expiresAt: at + 600_000,
    createdAt: at,
    closedAt: null
  }
})

describe("memory is used only under the epoch it was loaded under", () => {
  it("an actor loaded before a lost and regained claim does not decide from that memory", async () => {
    const memory = makeMemoryStore()
    const writtenUnder: Array<number | undefined> = []
    const store: StoreShape = {
      ...memory,
      write: (events, target) => {
        writtenUnder.push(target?.epoch)
        return memory.write(events)
      }
    }
    let epoch: number | undefined = 1
    const outcome = await runOnCoordinator(
      store,
      Effect.gen(function* () {
        const coordinator = yield* Coordinator
        const reserve = (id: string, amount: number) =>
          coordinator.submit({ op: "reserve", user, meter: "analysis", amount, id, ttlMs: 600_000 })
        const first = yield* reserve("before", 10)
        // Lost and claimed again (epoch 3) while the actor stayed resident; meanwhile the owner of
        // epoch 2 reserved 4 000 for the user.
        yield* Effect.orDie(memory.write([pendingHold("elsewhere", 4_000, 0)]))
        epoch = 3
        const fromOldMemory = yield* reserve("after", 4_000)
        const retried = yield* reserve("after", 4_000)
        return { first, fromOldMemory, retried }
      }),
      { servingEpoch: () => epoch }
    )
    expect(outcome.first.status).toBe("reserved")
    // Decided from the memory of epoch 1 this was granted: 4 010 reserved against 5 000, with 4 000 more.
    expect(outcome.fromOldMemory.status).toBe("unavailable")
    // The retry reloads under epoch 3 and sees the other owner's hold.
    expect(outcome.retried).toMatchObject({ status: "insufficient_quota", reserved: 4_010 })
    // Every write names the epoch its memory was loaded under.
    expect(writtenUnder).toEqual([1])
  })

  it("a partition lost while forgotten ids are recalled answers nothing from memory", async () => {
    const memory = makeMemoryStore()
    let releaseRecall = (): void => {}
    const recallHeld = new Promise<void>((resolve) => {
      releaseRecall = resolve
    })
    let recallStarted = false
    const store: StoreShape = {
      ...memory,
      // As a load capped at loadRememberedIdsPerUserMax: an id memory does not hold must be recalled.
      loadUsers: (loaded, now) =>
        Effect.map(
          memory.loadUsers(loaded, now),
          (stored) => new Map([...stored].map(([id, rows]) => [id, { ...rows, idsTruncated: true }]))
        ),
      recall: (recalled, ids, now) =>
        Effect.andThen(
          Effect.promise(() => {
            recallStarted = true
            return recallHeld
          }),
          memory.recall(recalled, ids, now)
        )
    }
    let epoch: number | undefined = 1
    const result = await runOnCoordinator(
      store,
      Effect.gen(function* () {
        const coordinator = yield* Coordinator
        yield* coordinator.submit({ op: "get_usage", user })
        const commit = yield* Effect.forkChild(
          coordinator.submit({ op: "commit", user, id: "x", amount: undefined })
        )
        while (!recallStarted) yield* settle
        // The partition is taken while the recall is out, and its new owner stores the hold.
        epoch = undefined
        yield* Effect.orDie(memory.write([pendingHold("x", 5, 0)]))
        releaseRecall()
        return yield* Fiber.join(commit)
      }),
      { servingEpoch: () => epoch }
    )
    // Decided from memory after the recall, this was `not_found`: a hold the store holds.
    expect(result.status).toBe("unavailable")
  })
})
