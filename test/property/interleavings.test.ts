/**
 * Interleavings: the real Coordinator under every order fc.scheduler picks for its store writes and
 * loads, checked by the auditor and the independent model (see interleavings.ts).
 */
import fc from "fast-check"
import { describe, it } from "vitest"
import { defaultConfig } from "../../src/domain/config.js"
import type { StoreEvent } from "../../src/domain/events.js"
import { makeMemoryStore } from "../../src/store/MemoryStore.js"
import { startCoordinator } from "../support/harness.js"
import { assertProperty, propertyTimeoutMs } from "../support/properties.js"
import { roundCommandsArb, setupArb } from "./arbitraries.js"
import type { Round, SystemUnderTest } from "./interleavings.js"
import { runInterleaving } from "./interleavings.js"

/** "ann: hold h1 pending, ledger, usage": what a write carries, short enough for the scheduler's log. */
const describeEvents = (events: ReadonlyArray<StoreEvent>): string =>
  events
    .map((event) => {
      switch (event.kind) {
        case "hold":
          return `${event.user}:hold ${event.hold.id} ${event.hold.state}`
        case "slot":
        case "slot_freed":
          return `${event.user}:${event.kind} ${event.job}`
        default:
          return `${event.user}:${event.kind}`
      }
    })
    .join(", ")

const coordinatorUnderTest = (
  residentActorsMax?: number,
  decisionsPerWriteMax?: number
): SystemUnderTest => ({
  name:
    residentActorsMax !== undefined
      ? `Coordinator (${residentActorsMax} resident actor)`
      : decisionsPerWriteMax !== undefined
        ? `Coordinator (groups of ${decisionsPerWriteMax})`
        : "Coordinator",
  config: defaultConfig,
  exact: true,
  mayRefuse: residentActorsMax !== undefined,
  start: async (scheduler, startAt) => {
    const write = scheduler.scheduleFunction(async function write(_events: string) {})
    const load = scheduler.scheduleFunction(async function load(_user: string) {})
    const store = makeMemoryStore({
      beforeWrite: (events) => write(describeEvents(events)),
      beforeLoad: (user) => load(user)
    })
    const harness = await startCoordinator({
      config: defaultConfig,
      store,
      startAt,
      ...(residentActorsMax === undefined ? {} : { residentActorsMax }),
      ...(decisionsPerWriteMax === undefined ? {} : { decisionsPerWriteMax })
    })
    return {
      store,
      fire: harness.fire,
      advance: harness.advance,
      errors: () => harness.errors,
      close: harness.close
    }
  }
})

const roundArb: fc.Arbitrary<Round> = fc.record({
  commands: roundCommandsArb,
  advanceMs: fc.constantFrom(0, 0, 1_500, 6_000, 61_000, 130_000)
})

const roundsArb = fc.array(roundArb, { minLength: 1, maxLength: 5 })

const variants: ReadonlyArray<{ name: string; label: string; system: () => SystemUnderTest }> = [
  {
    name: "keep used + reserved <= limit, slots <= plan, each id applied once, and answer as the model",
    label: "interleavings: Coordinator",
    system: () => coordinatorUnderTest()
  },
  {
    name: "the same with one resident actor: every other user's command evicts and reloads (or is overloaded)",
    label: "interleavings: Coordinator with one resident actor",
    system: () => coordinatorUnderTest(1)
  },
  {
    name: "the same with groups of two decisions: an actor run writes several groups in turn",
    label: "interleavings: Coordinator with groups of two",
    system: () => coordinatorUnderTest(undefined, 2)
  }
]

describe("interleavings (fc.scheduler orders every store write and load)", () => {
  for (const { name, label, system } of variants) {
    it(
      name,
      async () => {
        await assertProperty(
          label,
          fc.asyncProperty(setupArb, roundsArb, fc.scheduler(), async (setup, rounds, scheduler) => {
            await runInterleaving(system(), { setup, rounds, scheduler })
          })
        )
      },
      propertyTimeoutMs()
    )
  }
})
