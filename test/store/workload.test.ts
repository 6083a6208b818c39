/**
 * A random workload: fast-check generates commands per user, `decide` turns them into events the way
 * an actor would, and the events go to Postgres (concurrently across users, so they share commits)
 * and to the memory store. Afterwards the running totals must equal the ledger sums, Postgres must
 * load what the memory store loads, and the meters computed in SQL must equal the actors' own.
 */
import { Effect } from "effect"
import fc from "fast-check"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import type { Command } from "../../src/domain/commands.js"
import type { Config } from "../../src/domain/config.js"
import { defaultConfig } from "../../src/domain/config.js"
import type { DecideContext } from "../../src/domain/context.js"
import { decide } from "../../src/domain/decide.js"
import type { StoreEvent, StoredUser } from "../../src/domain/events.js"
import { amountMax } from "../../src/domain/limits.js"
import type { UserState } from "../../src/domain/state.js"
import { emptyUserState } from "../../src/domain/state.js"
import { makeMemoryStore } from "../../src/store/MemoryStore.js"
import type { PostgresStore } from "../../src/store/postgres/PostgresStore.js"
import { makePostgresStore } from "../../src/store/postgres/PostgresStore.js"
import { migrate } from "../../src/store/postgres/migrate.js"
import { acquireScoped, createTestSchema } from "../support/database.js"
import { loadUser } from "../support/loadUser.js"

/** Small limits so that insufficient_quota, overage and busy happen often. */
const config: Config = {
  ...defaultConfig,
  plans: {
    free: { slots: 1, limits: { analysis: 100, tokens: 1_000, storage_bytes: 1_000 } },
    pro: { slots: 2, limits: { analysis: 1_000, tokens: amountMax, storage_bytes: 10_000 } }
  }
}

const minuteMs = 60_000
const dayMs = 86_400_000
/** An hour before a month ends, so that workloads cross into the next period. */
const startAt = Date.UTC(2026, 9, 31, 23)

const ids = fc.constantFrom("a", "b", "c", "d")
const meters = fc.constantFrom("analysis", "analysis", "tokens", "storage_bytes", "unknown")
/** Edge-biased: 0, 1, near the limits, and the largest amount. */
const amounts = fc.oneof(
  { arbitrary: fc.integer({ min: 0, max: 60 }), weight: 4 },
  { arbitrary: fc.constantFrom(0, 1, 99, 100, 101, 999, 1_000, amountMax - 1, amountMax), weight: 1 }
)

const commandFor = (user: string): fc.Arbitrary<Command> =>
  fc.oneof(
    fc.record({
      op: fc.constant("reserve" as const),
      user: fc.constant(user),
      meter: meters,
      amount: amounts,
      id: ids,
      ttlMs: fc.constantFrom(1_000, 3_600_000)
    }),
    fc.record({
      op: fc.constant("consume" as const),
      user: fc.constant(user),
      id: ids,
      amount: amounts,
      key: fc.constantFrom("k1", "k2", "k3")
    }),
    fc.record({
      op: fc.constant("commit" as const),
      user: fc.constant(user),
      id: ids,
      amount: fc.option(amounts, { nil: undefined })
    }),
    fc.record({ op: fc.constant("release" as const), user: fc.constant(user), id: ids }),
    fc.record({
      op: fc.constant("extend" as const),
      user: fc.constant(user),
      id: ids,
      ttlMs: fc.constantFrom(1_000, 86_400_000)
    }),
    fc.record({
      op: fc.constant("adjust" as const),
      user: fc.constant(user),
      meter: meters,
      amount: fc.oneof(
        amounts,
        amounts.map((amount) => (amount === 0 ? 0 : -amount))
      ),
      id: fc.constantFrom("x", "y", "z", "w")
    }),
    fc.record({
      op: fc.constant("acquire_slot" as const),
      user: fc.constant(user),
      job: fc.constantFrom("j1", "j2", "j3"),
      leaseMs: fc.constantFrom(1_000, 120_000),
      waitMs: fc.constant(0)
    }),
    fc.record({
      op: fc.constant("renew_slot" as const),
      user: fc.constant(user),
      job: fc.constantFrom("j1", "j2", "j3"),
      leaseMs: fc.constant(120_000)
    }),
    fc.record({
      op: fc.constant("release_slot" as const),
      user: fc.constant(user),
      job: fc.constantFrom("j1", "j2", "j3")
    }),
    fc.record({
      op: fc.constant("set_plan" as const),
      user: fc.constant(user),
      plan: fc.constantFrom("free", "pro", "nope")
    }),
    fc.record({
      op: fc.constant("set_limit" as const),
      user: fc.constant(user),
      meter: meters,
      limit: fc.option(amounts, { nil: null })
    }),
    fc.constant({ op: "tick" as const, user })
  )

/** A step: let time pass (within a minute, past hold and lease ends, a day, past the retention window), then decide. */
const stepFor = (user: string) =>
  fc.record({
    elapsedMs: fc.oneof(
      { arbitrary: fc.constantFrom(0, 1_000, minuteMs), weight: 8 },
      { arbitrary: fc.constantFrom(2 * 3_600_000, dayMs, 8 * dayMs), weight: 1 }
    ),
    command: commandFor(user),
    /** The actor writes after this step, or keeps deciding and writes several decisions at once. */
    writeAfter: fc.boolean()
  })

/** Users, each with its steps; the user field is replaced by the run's user names. */
const workload = fc.array(fc.array(stepFor("placeholder"), { minLength: 1, maxLength: 80, size: "medium" }), {
  minLength: 1,
  maxLength: 6
})

const database = createTestSchema("workload")
let store: PostgresStore
let closeStore: () => Promise<void>
beforeAll(async () => {
  const pool = database.pool({ max: 4 })
  await Effect.runPromise(migrate(pool, database.schema))
  const opened = await acquireScoped(makePostgresStore({ pool, schema: database.schema, partitions: 64 }))
  store = opened.value
  closeStore = opened.close
})
afterAll(async () => {
  await closeStore()
  await database.drop()
})

const canonical = (stored: StoredUser): StoredUser => ({
  ...stored,
  limitOverrides: [...stored.limitOverrides].sort((left, right) => left.meter.localeCompare(right.meter)),
  usage: [...stored.usage].sort((left, right) => left.meter.localeCompare(right.meter)),
  holds: [...stored.holds]
    .map((hold) => ({ ...hold, consumeKeys: [...hold.consumeKeys].sort() }))
    .sort((left, right) => left.id.localeCompare(right.id)),
  adjustments: [...stored.adjustments].sort((left, right) => left.id.localeCompare(right.id)),
  slots: [...stored.slots].sort((left, right) => left.job.localeCompare(right.job))
})

let run = 0

describe("a random workload written through PostgresStore", () => {
  it("keeps totals equal to the ledger, loads like the memory store, and agrees with the actors", async () => {
    let events = 0
    await fc.assert(
      fc.asyncProperty(workload, async (userSteps) => {
        run += 1
        const memory = makeMemoryStore()
        const users = userSteps.map((_, index) => `run${run}-user${index}`)
        const finalStates = new Map<string, { state: UserState; now: number }>()
        // One actor per user: decide, then write, one write in flight; users run concurrently.
        const actor = (user: string, steps: (typeof userSteps)[number]) =>
          Effect.gen(function* () {
            let state = emptyUserState(user)
            let now = startAt
            let unwritten: Array<StoreEvent> = []
            for (const [index, step] of steps.entries()) {
              now += step.elapsedMs
              const ctx: DecideContext = { config, now, random: () => 0.5 }
              const decision = decide(state, { ...step.command, user } as Command, ctx, { assertFull: true })
              state = decision.state
              unwritten.push(...decision.events)
              if (!step.writeAfter && index < steps.length - 1) continue
              events += unwritten.length
              yield* store.write(unwritten)
              yield* memory.write(unwritten)
              unwritten = []
            }
            finalStates.set(user, { state, now })
          })
        await Effect.runPromise(
          Effect.forEach(users, (user, index) => actor(user, userSteps[index]!), {
            concurrency: "unbounded",
            discard: true
          })
        )

        // This run's users only, so that a failure shrinks to the run that caused it.
        const mismatches = await Effect.runPromise(store.reconcile())
        expect(mismatches.filter((mismatch) => users.includes(mismatch.user))).toEqual([])
        expect(memory.duplicateLedgerKeys()).toBe(0)
        const sqlMeters = await Effect.runPromise(store.meterStates())
        for (const user of users) {
          const { state, now } = finalStates.get(user)!
          const fromPostgres = await Effect.runPromise(loadUser(store, user, now))
          const fromMemory = await Effect.runPromise(loadUser(memory, user, now))
          expect(canonical(fromPostgres)).toEqual(canonical(fromMemory))
          // The actor's reserved and pending counts are what the rows say.
          for (const [meter, meterState] of state.meters) {
            const row = sqlMeters.find((candidate) => candidate.user === user && candidate.meter === meter)
            expect({ meter, reserved: row?.reserved ?? 0, pendingHolds: row?.pendingHolds ?? 0 }).toEqual({
              meter,
              reserved: meterState.reserved,
              pendingHolds: meterState.pendingHolds
            })
            if (row !== undefined && row.periodStart === meterState.periodStart) {
              expect({ meter, used: row.used }).toEqual({ meter, used: meterState.used })
            }
          }
        }
      }),
      { numRuns: 150 }
    )
    // The workload must have written something for the checks above to mean anything.
    expect(events).toBeGreaterThan(2_000)
    expect(await Effect.runPromise(store.reconcile())).toEqual([])
    const stats = await Effect.runPromise(store.commitStats)
    expect(stats.failedCommits).toBe(0)
    console.info(`workload: ${events} events in ${stats.commits} commits over ${run} runs`)
  })
})
