/**
 * Commands for the properties, drawn from small pools so that they collide: two users, a few hold ids,
 * keys, adjust ids and jobs, small amounts against small limits (set with set_limit first).
 */
import fc from "fast-check"
import type { Command } from "../../src/domain/commands.js"

export const propertyUsers = ["ann", "bob"] as const
/** Configured meters, and one well-formed name that is not configured. */
export const propertyMeters = ["analysis", "tokens", "storage_bytes"] as const
const meterArb = fc.oneof(
  { weight: 12, arbitrary: fc.constantFrom(...propertyMeters) },
  { weight: 1, arbitrary: fc.constant("nope") }
)
const userArb = fc.constantFrom(...propertyUsers)
const holdIdArb = fc.constantFrom("h1", "h2", "h3")
const keyArb = fc.constantFrom("k1", "k2", "k3")
const adjustIdArb = fc.constantFrom("a1", "a2", "a3")
const jobArb = fc.constantFrom("j1", "j2", "j3")
const ttlArb = fc.constantFrom(1_000, 5_000, 60_000, 3_600_000)
const leaseArb = fc.constantFrom(1_000, 5_000, 120_000)
const waitArb = fc.constantFrom(0, 0, 2_000, 30_000)

/** Limits small enough that a few holds fill them. */
export const limitArb = fc.integer({ min: 0, max: 12 })

export const reserveArb: fc.Arbitrary<Command> = fc.record({
  op: fc.constant("reserve" as const),
  user: userArb,
  meter: meterArb,
  amount: fc.integer({ min: 0, max: 8 }),
  id: holdIdArb,
  ttlMs: ttlArb
})

const consumeArb: fc.Arbitrary<Command> = fc.record({
  op: fc.constant("consume" as const),
  user: userArb,
  id: holdIdArb,
  amount: fc.integer({ min: 0, max: 6 }),
  key: keyArb
})

const commitArb: fc.Arbitrary<Command> = fc.record({
  op: fc.constant("commit" as const),
  user: userArb,
  id: holdIdArb,
  amount: fc.option(fc.integer({ min: 0, max: 10 }), { nil: undefined })
})

const releaseArb: fc.Arbitrary<Command> = fc.record({
  op: fc.constant("release" as const),
  user: userArb,
  id: holdIdArb
})

const extendArb: fc.Arbitrary<Command> = fc.record({
  op: fc.constant("extend" as const),
  user: userArb,
  id: holdIdArb,
  ttlMs: ttlArb
})

const adjustArb: fc.Arbitrary<Command> = fc.record({
  op: fc.constant("adjust" as const),
  user: userArb,
  meter: meterArb,
  amount: fc.integer({ min: -6, max: 5 }),
  id: adjustIdArb
})

const acquireArb: fc.Arbitrary<Command> = fc.record({
  op: fc.constant("acquire_slot" as const),
  user: fc.oneof({ weight: 10, arbitrary: userArb }, { weight: 1, arbitrary: fc.constant("") }),
  job: jobArb,
  leaseMs: leaseArb,
  waitMs: waitArb
})

const renewArb: fc.Arbitrary<Command> = fc.record({
  op: fc.constant("renew_slot" as const),
  user: fc.oneof({ weight: 10, arbitrary: userArb }, { weight: 1, arbitrary: fc.constant("") }),
  job: jobArb,
  leaseMs: leaseArb
})

const releaseSlotArb: fc.Arbitrary<Command> = fc.record({
  op: fc.constant("release_slot" as const),
  user: fc.oneof({ weight: 10, arbitrary: userArb }, { weight: 1, arbitrary: fc.constant("") }),
  job: jobArb
})

const getUsageArb: fc.Arbitrary<Command> = fc.record({ op: fc.constant("get_usage" as const), user: userArb })

/** Small limits, so `more` is true as often as not. */
const listHoldsArb: fc.Arbitrary<Command> = fc.record({
  op: fc.constant("list_holds" as const),
  user: userArb,
  state: fc.constantFrom("pending" as const, "closed" as const, "all" as const),
  limit: fc.integer({ min: 1, max: 4 })
})

export const setLimitArb: fc.Arbitrary<Command> = fc.record({
  op: fc.constant("set_limit" as const),
  user: userArb,
  meter: meterArb,
  limit: fc.option(limitArb, { nil: null, freq: 5 })
})

export const setPlanArb: fc.Arbitrary<Command> = fc.record({
  op: fc.constant("set_plan" as const),
  user: userArb,
  plan: fc.constantFrom("free", "pro", "gold")
})

/**
 * Administration that moves limits, for the thresholds a lowered limit crosses: a plan change, a limit
 * set, or a meter back to its plan's limit (so that the next plan change moves it).
 */
export const limitChangeArb: fc.Arbitrary<Command> = fc.oneof(
  setPlanArb,
  setLimitArb,
  fc.record({
    op: fc.constant("set_limit" as const),
    user: userArb,
    meter: fc.constantFrom(...propertyMeters),
    limit: fc.constant(null)
  })
)

/** Every operation; reserve and the hold operations weigh most, admin changes least. */
export const commandArb: fc.Arbitrary<Command> = fc.oneof(
  { weight: 8, arbitrary: reserveArb },
  { weight: 4, arbitrary: consumeArb },
  { weight: 4, arbitrary: commitArb },
  { weight: 3, arbitrary: releaseArb },
  { weight: 2, arbitrary: extendArb },
  { weight: 3, arbitrary: adjustArb },
  { weight: 4, arbitrary: acquireArb },
  { weight: 2, arbitrary: renewArb },
  { weight: 3, arbitrary: releaseSlotArb },
  { weight: 1, arbitrary: getUsageArb },
  { weight: 1, arbitrary: listHoldsArb },
  { weight: 1, arbitrary: setLimitArb },
  { weight: 1, arbitrary: setPlanArb }
)

/**
 * Setup: each user's plan and a limit on every meter (`null`: the plan's), applied one at a time
 * before the concurrency.
 */
const setupWith = (meterLimitArb: fc.Arbitrary<number | null>): fc.Arbitrary<Array<Command>> =>
  fc
    .tuple(
      ...propertyUsers.map((user) =>
        fc
          .record({
            plan: fc.constantFrom("free", "free", "pro"),
            limits: fc.tuple(meterLimitArb, meterLimitArb, meterLimitArb)
          })
          .map(({ plan, limits }): Array<Command> => [
            { op: "set_plan", user, plan },
            ...propertyMeters.map((meter, index): Command => ({
              op: "set_limit",
              user,
              meter,
              limit: limits[index]!
            }))
          ])
      )
    )
    .map((perUser) => perUser.flat())

/** Setup with a small limit on every meter (the default configuration's plan limits are large). */
export const setupArb: fc.Arbitrary<Array<Command>> = setupWith(limitArb)

/**
 * Setup where a meter is left on its plan's limit one time in three, for a configuration with small
 * plan limits: a plan change then moves the limit (and may cross thresholds).
 */
export const setupOnPlansArb: fc.Arbitrary<Array<Command>> = setupWith(
  fc.option(limitArb, { nil: null, freq: 3 })
)

/** A short description of a command, for counterexamples. */
export const showCommand = (command: Command): string => {
  const { op, user, ...rest } = command
  const fields = Object.entries(rest)
    .filter(([, value]) => value !== undefined)
    .map(([key, value]) => `${key}=${JSON.stringify(value)}`)
  return `${op}(${JSON.stringify(user)}${fields.length > 0 ? ", " + fields.join(", ") : ""})`
}

/** One hold's life on one (user, id): a reserve, then some of consume, commit, release, extend on it. */
export const holdChainArb: fc.Arbitrary<Array<Command>> = fc
  .record({
    user: userArb,
    id: holdIdArb,
    meter: fc.constantFrom(...propertyMeters),
    amount: fc.integer({ min: 0, max: 6 }),
    ttlMs: ttlArb,
    consumes: fc.array(fc.record({ key: keyArb, amount: fc.integer({ min: 0, max: 4 }) }), { maxLength: 2 }),
    end: fc.constantFrom("commit", "commit_amount", "release", "extend", "none"),
    endAmount: fc.integer({ min: 0, max: 9 })
  })
  .map(({ user, id, meter, amount, ttlMs, consumes, end, endAmount }): Array<Command> => [
    { op: "reserve", user, meter, amount, id, ttlMs },
    ...consumes.map((consume): Command => ({ op: "consume", user, id, ...consume })),
    ...(end === "commit"
      ? [{ op: "commit", user, id, amount: undefined } as const]
      : end === "commit_amount"
        ? [{ op: "commit", user, id, amount: endAmount } as const]
        : end === "release"
          ? [{ op: "release", user, id } as const]
          : end === "extend"
            ? [{ op: "extend", user, id, ttlMs } as const]
            : [])
  ])

/** One job's slot: acquire (maybe waiting), maybe renew, maybe release. */
export const slotChainArb: fc.Arbitrary<Array<Command>> = fc
  .record({
    user: userArb,
    job: jobArb,
    leaseMs: leaseArb,
    waitMs: fc.constantFrom(0, 2_000, 30_000),
    renew: fc.boolean(),
    release: fc.boolean()
  })
  .map(({ user, job, leaseMs, waitMs, renew, release }): Array<Command> => [
    { op: "acquire_slot", user, job, leaseMs, waitMs },
    ...(renew ? [{ op: "renew_slot", user, job, leaseMs } as const] : []),
    ...(release ? [{ op: "release_slot", user, job } as const] : [])
  ])

/** A round's commands: single commands of every kind mixed with whole hold and slot lives. */
export const roundCommandsArb: fc.Arbitrary<Array<Command>> = fc
  .array(
    fc.oneof(
      { weight: 4, arbitrary: commandArb.map((command) => [command]) },
      { weight: 2, arbitrary: holdChainArb },
      { weight: 2, arbitrary: slotChainArb }
    ),
    { minLength: 1, maxLength: 6 }
  )
  .map((chunks) => chunks.flat())
