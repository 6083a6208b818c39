/**
 * Reads of the tables see every acknowledged change (issue 36): the tables are the log's checkpoint,
 * written up to a second after an append, so a decision that reads them for a user whose appends are
 * not all in them (a `usage_history` whose past period ended a moment ago) waits for a checkpoint first.
 *
 * This machine's Postgres (the file's own schema); the coordinator's clock is the wall clock shifted
 * to just before a month's end, then past it, within the checkpoint interval.
 */
import { Context, Duration, Effect, Layer } from "effect"
import { Clock } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import type { CoordinatorShape } from "../../src/actors/Coordinator.js"
import { Coordinator, coordinatorLayer } from "../../src/actors/Coordinator.js"
import type { Command } from "../../src/domain/commands.js"
import { defaultConfig } from "../../src/domain/config.js"
import { checkpointIntervalMs } from "../../src/domain/limits.js"
import type { Result } from "../../src/domain/results.js"
import { postgresStoreLayer } from "../../src/store/postgres/PostgresStore.js"
import type { TestSchema } from "../support/database.js"
import { acquireScoped, createTestSchema } from "../support/database.js"

const partitions = 64
let database: TestSchema
let system: { value: CoordinatorShape; close: () => Promise<void> }
/** Added to the wall clock: the coordinator's time. */
let offsetMs = 0

const shiftedNow = (): number => Date.now() + offsetMs
/** The wall clock moved by `offsetMs`; its sleeps are real timers (a shift does not wake them). */
const shiftedClock: Clock.Clock = {
  currentTimeMillisUnsafe: shiftedNow,
  currentTimeMillis: Effect.sync(shiftedNow),
  currentTimeNanosUnsafe: () => BigInt(shiftedNow()) * 1_000_000n,
  currentTimeNanos: Effect.sync(() => BigInt(shiftedNow()) * 1_000_000n),
  monotonicTimeNanosUnsafe: () => process.hrtime.bigint(),
  monotonicTimeNanos: Effect.sync(() => process.hrtime.bigint()),
  sleep: (duration: Duration.Duration) =>
    Effect.callback<void>((resume) => {
      const timer = setTimeout(() => resume(Effect.void), Duration.toMillis(duration))
      return Effect.sync(() => clearTimeout(timer))
    })
}

beforeAll(async () => {
  database = createTestSchema("checkpoint_reads")
  const layer = coordinatorLayer({ config: defaultConfig, sweepIntervalMs: 0, partitions }).pipe(
    Layer.provideMerge(
      postgresStoreLayer({
        connectionString: database.connectionString,
        schema: database.schema,
        prefix: "checkpoint-reads",
        partitions
      })
    ),
    Layer.provide(Layer.succeed(Clock.Clock, shiftedClock))
  )
  system = await acquireScoped(
    Effect.gen(function* () {
      const context = yield* Layer.build(layer)
      return Context.get(context, Coordinator)
    })
  )
})

afterAll(async () => {
  await system?.close()
  await database?.drop()
})

const submit = (command: Command): Promise<Result> => Effect.runPromise(system.value.submit(command))

/** The start of the month `at` is in, moved by `months`. */
const monthStart = (at: number, months = 0): number => {
  const date = new Date(at)
  return Date.UTC(date.getUTCFullYear(), date.getUTCMonth() + months, 1)
}

describe("a read of the tables for a user with changes not yet in them", () => {
  it("usage_history right after a month's end shows the month's last charge", async () => {
    const user = "history-at-month-end"
    const monthEnd = monthStart(Date.now(), 1)
    offsetMs = monthEnd - 400 - Date.now()
    expect(
      await submit({ op: "adjust", user, meter: "analysis", amount: 30, id: "last-of-month" })
    ).toMatchObject({ status: "adjusted" })
    // Past the month's end, well within the checkpoint interval of that append.
    offsetMs += 500
    const askedAt = shiftedNow()
    const history = await submit({ op: "usage_history", user, meter: "analysis", periods: 2 })
    expect(askedAt - monthEnd).toBeLessThan(checkpointIntervalMs / 2)
    expect(history).toEqual({
      status: "ok",
      history: [
        {
          meter: "analysis",
          period: "month",
          periods: [
            { periodStart: monthEnd, used: 0 },
            { periodStart: monthStart(monthEnd - 1), used: 30 }
          ]
        }
      ]
    })
  })
})
