/**
 * A partition actor whose log is not open yet (a claim just made, a failover's tail still being brought
 * into the tables) waits for the open without spinning, and a failed open is tried again after a
 * pause, not at once:
 * - commands queued while the open runs kept the actor's loop busy (its step found nothing it could do
 *   and ran again, yielding only at the end of each turn) for as long as the open took, which after a
 *   failover is when the process has the least CPU to spare;
 * - an open that failed was started again at once as long as anything waited for it (a publisher
 *   starting, the orphan sweep), in a loop of failures against a store that refuses.
 */
import { Effect, Fiber } from "effect"
import { TestClock } from "effect/testing"
import { describe, expect, it } from "vitest"
import { Coordinator } from "../../src/actors/Coordinator.js"
import { failedWriteRetryDelayMs } from "../../src/domain/limits.js"
import { makeMemoryStore } from "../../src/store/MemoryStore.js"
import type { StoreShape } from "../../src/store/Store.js"
import { StoreUnavailable } from "../../src/store/Store.js"
import { runOnCoordinator } from "../support/harness.js"

const user = "open-wait-user"
const realDelay = (ms: number) =>
  Effect.promise(() => new Promise<void>((resolve) => setTimeout(resolve, ms)))

describe("a partition actor waiting for its log to open", () => {
  it("does not run its loop over and over while the open takes its time", async () => {
    const memory = makeMemoryStore()
    const store: StoreShape = {
      ...memory,
      openPartition: (partition) => Effect.andThen(realDelay(300), memory.openPartition(partition))
    }
    let epochReads = 0
    const result = await runOnCoordinator(
      store,
      Effect.gen(function* () {
        const coordinator = yield* Coordinator
        return yield* coordinator.submit({ op: "get_usage", user })
      }),
      {
        servingEpoch: () => {
          epochReads += 1
          return 1
        }
      }
    )
    expect(result.status).toBe("ok")
    // The epoch is read each time the loop tries to form a batch: a few times, not once per spin.
    console.log(`epoch read ${epochReads} times over a 300 ms open`)
    expect(epochReads).toBeLessThan(50)
  })

  it("tries a failed open again after failedWriteRetryDelayMs, not at once", async () => {
    const memory = makeMemoryStore()
    let opens = 0
    let failing = true
    const store: StoreShape = {
      ...memory,
      openPartition: (partition) =>
        Effect.suspend(() => {
          opens += 1
          return failing
            ? Effect.fail(new StoreUnavailable({ reason: "open: connection refused" }))
            : memory.openPartition(partition)
        })
    }
    const outcome = await runOnCoordinator(
      store,
      Effect.gen(function* () {
        const coordinator = yield* Coordinator
        // Something waits for the open (a publisher starting): it may not drive a loop of failures.
        const waiting = yield* Effect.forkChild(coordinator.whenOpened(0))
        yield* realDelay(200)
        const opensWhileFailing = opens
        failing = false
        yield* TestClock.adjust(failedWriteRetryDelayMs)
        yield* realDelay(50)
        yield* Fiber.join(waiting)
        return { opensWhileFailing, opensAfter: opens }
      })
    )
    expect(outcome.opensWhileFailing).toBe(1)
    expect(outcome.opensAfter).toBe(2)
  })
})
