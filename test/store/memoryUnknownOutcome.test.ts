/**
 * The memory store's writes of unknown outcome (the lifecycle property's fault): the write fails at once,
 * its events land later or never as the test decides, and a load waits until every such write is
 * settled, as the Postgres store makes a commit of unknown outcome final before loading
 * (outcomeDoubts.ts). With settleBeforeLoad false the load reads at once (the broken variant).
 */
import { Effect, Exit } from "effect"
import { describe, expect, it } from "vitest"
import type { StoreEvent } from "../../src/domain/events.js"
import { makeMemoryStore } from "../../src/store/MemoryStore.js"
import { flushTurns } from "../support/harness.js"
import { loadUser } from "../support/loadUser.js"

const now = Date.UTC(2026, 1, 1)
const planEvent: StoreEvent = { kind: "plan", user: "u", plan: "pro" }

/** A store whose next write's outcome is unknown, settled by `settle(applied)`. */
const storeWithDoubt = (settleBeforeLoad?: boolean) => {
  let settle: (applied: boolean) => void = () => {}
  let armed = true
  const store = makeMemoryStore({
    outcomeUnknown: () => {
      if (!armed) return undefined
      armed = false
      return new Promise<boolean>((resolve) => (settle = resolve))
    },
    ...(settleBeforeLoad === undefined ? {} : { settleBeforeLoad })
  })
  return { store, settle: (applied: boolean) => settle(applied) }
}

/** Starts a load and says whether it has finished, and with which plan. */
const startLoad = (store: ReturnType<typeof makeMemoryStore>) => {
  let plan: string | null | undefined
  const done = Effect.runPromise(loadUser(store, "u", now)).then((loaded) => (plan = loaded.plan))
  return { done, plan: () => plan }
}

describe("memory store: a write of unknown outcome", () => {
  it.each([
    [true, "pro"],
    [false, null]
  ] as const)("fails at once; a load waits until it is settled (applied: %s)", async (applied, plan) => {
    const { store, settle } = storeWithDoubt()
    const written = await Effect.runPromiseExit(store.write([planEvent]))
    expect(Exit.isFailure(written)).toBe(true)
    expect(store.unsettledWrites()).toBe(1)
    const load = startLoad(store)
    await flushTurns(20)
    expect(load.plan(), "the load must wait for the outcome").toBeUndefined()
    settle(applied)
    await load.done
    expect(load.plan()).toBe(plan)
    expect(store.unsettledWrites()).toBe(0)
  })

  it("with settleBeforeLoad false, a load reads before the late write lands", async () => {
    const { store, settle } = storeWithDoubt(false)
    await Effect.runPromiseExit(store.write([planEvent]))
    const load = startLoad(store)
    await load.done
    expect(load.plan()).toBeNull()
    settle(true)
    await flushTurns(1)
    expect(store.rows.get("u")?.plan).toBe("pro")
  })
})
