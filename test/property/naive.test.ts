/**
 * The interleaving property can fail: run against a deliberately naive reservation that checks, then
 * awaits, then writes (what the seeds' first services did), the same auditor must find an over-grant.
 * The test expects the property to fail and prints the counterexample fast-check found.
 */
import { Effect } from "effect"
import fc from "fast-check"
import { describe, expect, it } from "vitest"
import type { Command } from "../../src/domain/commands.js"
import { defaultConfig } from "../../src/domain/config.js"
import type { Result } from "../../src/domain/results.js"
import { makeMemoryStore } from "../../src/store/MemoryStore.js"
import type { Fired } from "../support/harness.js"
import { periodStartOf } from "../support/model.js"
import { assertProperty, propertyParameters, propertyTimeoutMs } from "../support/properties.js"
import { reserveArb, setupArb } from "./arbitraries.js"
import type { Round, SystemUnderTest } from "./interleavings.js"
import { runInterleaving } from "./interleavings.js"
import { loadUser } from "../support/loadUser.js"

/**
 * Reads the user's usage and pending holds from the store, awaits a point the scheduler releases (a
 * network round trip), then writes the hold if the stale read said it fits. Nothing serializes two
 * reservations of one user: that is the bug.
 */
const naiveUnderTest: SystemUnderTest = {
  name: "naive check-then-write",
  config: defaultConfig,
  exact: false,
  start: async (scheduler, startAt) => {
    const store = makeMemoryStore()
    const roundTrip = scheduler.scheduleFunction(async function roundTrip(_what: string) {})
    const decide = async (command: Command): Promise<Result> => {
      const events = async (...list: Parameters<typeof store.write>[0]) =>
        Effect.runPromise(store.write(list))
      switch (command.op) {
        case "set_plan":
          await events({ kind: "plan", user: command.user, plan: command.plan })
          return { status: "ok" }
        case "set_limit":
          await events({ kind: "limit", user: command.user, meter: command.meter, limit: command.limit })
          return { status: "ok" }
        case "reserve": {
          const stored = await Effect.runPromise(loadUser(store, command.user, startAt))
          const period = defaultConfig.meters.find((meter) => meter.name === command.meter)?.period
          if (period === undefined) return { status: "unknown_meter" }
          const used =
            stored.usage.find(
              (row) => row.meter === command.meter && row.periodStart === periodStartOf(period, startAt)
            )?.used ?? 0
          const reserved = stored.holds
            .filter((hold) => hold.meter === command.meter && hold.state === "pending")
            .reduce((sum, hold) => sum + Math.max(0, hold.amount - hold.consumed), 0)
          const plan = stored.plan ?? defaultConfig.defaultPlan
          const limit =
            stored.limitOverrides.find((entry) => entry.meter === command.meter)?.limit ??
            defaultConfig.plans[plan]?.limits[command.meter] ??
            0
          const known = stored.holds.find((hold) => hold.id === command.id)
          const view = { meter: command.meter, limit, used, reserved }
          if (known !== undefined) {
            return { status: "closed", ...view, available: limit - used - reserved, overage: 0, ...known }
          }
          if (used + reserved + command.amount > limit) {
            return {
              status: "insufficient_quota",
              requested: command.amount,
              pendingHolds: 0,
              ...view,
              available: limit - used - reserved,
              overage: Math.max(0, used + reserved - limit)
            }
          }
          await roundTrip(`${command.user} ${command.id} saw ${used}+${reserved}`)
          const hold = {
            id: command.id,
            meter: command.meter,
            amount: command.amount,
            consumed: 0,
            state: "pending" as const,
            expiresAt: startAt + command.ttlMs,
            createdAt: startAt,
            closedAt: null
          }
          await events({ kind: "hold", user: command.user, hold })
          const after = reserved + command.amount
          return {
            status: "reserved",
            ...view,
            reserved: after,
            available: limit - used - after,
            overage: 0,
            id: hold.id,
            amount: hold.amount,
            consumed: 0,
            state: "pending",
            expiresAt: hold.expiresAt
          }
        }
        default:
          throw new Error(`the naive variant decides reserve only, not ${command.op}`)
      }
    }
    return {
      store,
      fire: (command): Fired => {
        let value: Result | undefined
        const promise = decide(command).then((result) => {
          value = result
          return result
        })
        return { command, promise, settled: () => value !== undefined, value: () => value, atOnce: undefined }
      },
      advance: async () => {},
      errors: () => [],
      close: async () => {}
    }
  }
}

/** One round of reserves on `analysis`, each with its own id, so every grant is a new hold. */
const naiveRoundArb: fc.Arbitrary<Round> = fc
  .array(reserveArb, { minLength: 2, maxLength: 8 })
  .map((commands) => ({
    commands: commands.map((command, index) =>
      command.op === "reserve" ? { ...command, id: `n${index}`, meter: "analysis" } : command
    ),
    advanceMs: 0
  }))

describe("the interleaving property can fail", () => {
  it(
    "finds the over-grant of a naive check-then-await-then-write reservation",
    async () => {
      const failure = await assertProperty(
        "interleavings: naive check-then-write",
        fc.asyncProperty(
          setupArb,
          naiveRoundArb.map((round) => [round]),
          fc.scheduler(),
          async (setup, rounds, scheduler) => {
            await runInterleaving(naiveUnderTest, { setup, rounds, scheduler })
          }
        ),
        // Any seed finds it; the runs are the default so a long run searches as long as the others.
        propertyParameters()
      ).then(
        () => undefined,
        (error: unknown) => (error instanceof Error ? error.message : String(error))
      )
      expect(failure, "the auditor must reject the naive reservation").toBeDefined()
      expect(failure).toMatch(/durable used \d+ \+ reserved \d+ > limit \d+/)
      console.log(`counterexample the auditor found against the naive reservation:\n${failure}`)
    },
    propertyTimeoutMs()
  )
})
