/**
 * The workloads, each a "cycle" one worker runs again and again. Every target runs the same cycles with
 * the same seeded choices; a step its design lacks answers "none" (see Target.ts).
 */
import type { HoldRef, MeterName, StepOutcome, Target } from "../targets/Target.js"
import { meterLimits, slotsPerUser } from "../targets/Target.js"
import type { Rng } from "./rng.js"
import type { Tally } from "./tally.js"

export const workloadKeys = ["uniform", "hot-granted", "hot", "mix"] as const
export type WorkloadKey = (typeof workloadKeys)[number]

/** Distinct users of the uniform and mix workloads. */
const uniformUsers = 10_000

/** Hot workload: each hold's amount; with the `hot` limit of 100, at most 10 holds fit at once. */
const hotHoldAmount = 10
/** Hot workload: the hot user changes after this many grants, before its usage eats its limit. */
const hotGrantsPerUser = 100

export type StepName = "reserve" | "consume" | "commit" | "release" | "acquire_slot" | "release_slot"

/** What a cycle calls for each step: runs it, times it, counts it. */
export type RunStep = (step: StepName, send: () => Promise<StepOutcome>) => Promise<StepOutcome>

export interface CycleContext {
  readonly target: Target
  readonly rng: Rng
  readonly tally: Tally
  readonly step: RunStep
  /** A hold or job id unique in the whole bench run. */
  readonly nextId: () => string
  /** What one worker carries from one cycle to the next. */
  readonly worker: { heldHold: HoldRef | undefined }
}

/** One cycle; resolves true when it counts as a cycle (hot-granted: only when granted and committed). */
export type Cycle = (context: CycleContext) => Promise<boolean>

export interface Workload {
  readonly key: WorkloadKey
  readonly title: string
  readonly description: string
  /** The users to prime (empty: created as the run goes). */
  readonly users: ReadonlyArray<string>
  readonly meter: MeterName
  /** The cycle of one run, `runTag` unique to it (the hot users are per run). */
  readonly startRun: (runTag: string) => Cycle
}

const reserveTallied = async (context: CycleContext, hold: HoldRef): Promise<StepOutcome> => {
  const outcome = await context.step("reserve", () => context.target.reserve(hold))
  if (outcome === "ok") context.tally.granted(hold.user, hold.meter, hold.amount)
  return outcome
}

const consumeTallied = async (context: CycleContext, hold: HoldRef, amount: number, key: string) => {
  context.tally.returning(hold.user, hold.meter, amount)
  const outcome = await context.step("consume", () => context.target.consume(hold, amount, key))
  if (outcome === "ok" || outcome === "none") context.tally.charged(hold.user, hold.meter, amount)
  return outcome
}

const commitTallied = async (context: CycleContext, hold: HoldRef, actual: number) => {
  context.tally.returning(hold.user, hold.meter, hold.amount - hold.consumed)
  const outcome = await context.step("commit", () => context.target.commit(hold, actual))
  // "none": the design settles without a request (seed 003 when nothing is refunded); the usage stands.
  if (outcome === "ok" || outcome === "none")
    context.tally.charged(hold.user, hold.meter, actual - hold.consumed)
  return outcome
}

const releaseTallied = async (context: CycleContext, hold: HoldRef) => {
  context.tally.returning(hold.user, hold.meter, hold.amount - hold.consumed)
  return context.step("release", () => context.target.release(hold))
}

const newHold = (context: CycleContext, user: string, meter: MeterName, amount: number): HoldRef => ({
  user,
  meter,
  id: context.nextId(),
  amount,
  consumed: 0
})

const usersNamed = (prefix: string): ReadonlyArray<string> =>
  Array.from({ length: uniformUsers }, (_, index) => `${prefix}${index}`)

/** Reserve 10 for one of 10 000 users, then commit 10. */
const uniformWorkload = (namespace: string): Workload => {
  const users = usersNamed(`${namespace}-uni-`)
  return {
    key: "uniform",
    title: "uniform",
    description: `${uniformUsers} users chosen uniformly; each cycle reserves 10 of \`work\` (limit ${meterLimits.work}, never reached) and commits 10.`,
    users,
    meter: "work",
    startRun: () => async (context) => {
      const hold = newHold(context, users[context.rng.int(users.length)]!, "work", 10)
      if ((await reserveTallied(context, hold)) === "ok") await commitTallied(context, hold, 10)
      return true
    }
  }
}

/**
 * Every worker on one user with room in its limit: every reserve should be granted, then committed.
 * It commits less than it reserved so that every design sends a request for the commit (seed 003
 * refunds only the unused rest, and sends nothing when there is none).
 */
const hotGrantedWorkload = (): Workload => ({
  key: "hot-granted",
  title: "hot user, granted",
  description: `every worker on one user (a new one per run) with \`work\`'s limit of ${meterLimits.work}, never reached: each cycle reserves 10 and commits 5 (so seed 003 sends its refund too). Only cycles whose reserve was granted and whose commit succeeded count; a refused reserve shows in *refused* and the cycle is not counted.`,
  users: [],
  meter: "work",
  startRun: (runTag) => {
    const user = `hotg-${runTag}`
    return async (context) => {
      const hold = newHold(context, user, "work", 10)
      if ((await reserveTallied(context, hold)) !== "ok") return false
      const committed = await commitTallied(context, hold, 5)
      return committed === "ok" || committed === "none"
    }
  }
})

/**
 * Every worker on one user with a tight limit: most reserves are refused at high concurrency.
 *
 * Each worker keeps its granted hold while its next reserve is in flight and settles it (commit at 1 or
 * release) only after that reply. Holds held for no time at all could never be seen to overlap from the
 * client's side, so no over-grant could be proven (see tally.ts); held across the next request, every
 * grant the system makes while another worker's hold is pending is checked.
 */
const hotWorkload = (): Workload => ({
  key: "hot",
  title: "hot user at its limit (mostly refusals)",
  description: `every worker on one user; \`hot\` limit ${meterLimits.hot}, holds of ${hotHoldAmount} (at most ${meterLimits.hot / hotHoldAmount} fit at once), so most reserves are refused, and a refusal writes nothing. A worker keeps its granted hold while its next reserve is in flight, then commits it at 1 (half) or releases it (half). The hot user changes every ${hotGrantsPerUser} grants so its usage never exhausts the limit. A cycle is one reserve (granted or refused) and the settling of the previous hold.`,
  users: [],
  meter: "hot",
  startRun: (runTag) => {
    let generation = 0
    let grants = 0
    return async (context) => {
      const hold = newHold(context, `hot-${runTag}-${generation}`, "hot", hotHoldAmount)
      const granted = (await reserveTallied(context, hold)) === "ok"
      if (granted && (grants += 1) >= hotGrantsPerUser) {
        grants = 0
        generation += 1
      }
      const previous = context.worker.heldHold
      context.worker.heldHold = granted ? hold : undefined
      if (previous === undefined) return true
      if (context.rng.next() < 0.5) await commitTallied(context, previous, 1)
      else await releaseTallied(context, previous)
      return true
    }
  }
})

/**
 * A job's life: a slot (coordinator only: the baselines' designs have no slots), a hold of 100, two
 * consumptions of 30, then commit at 80 (3 in 4) or release (1 in 4), then the slot back.
 */
const mixWorkload = (namespace: string): Workload => {
  const users = usersNamed(`${namespace}-mix-`)
  return {
    key: "mix",
    title: "mix",
    description: `${uniformUsers} users; a job = acquire_slot (coordinator only, ${slotsPerUser} slots per user; the baselines have no slots), reserve 100 of \`work\`, consume 30 twice, commit 80 (3 in 4) or release (1 in 4), release_slot.`,
    users,
    meter: "work",
    startRun: () => async (context) => {
      const user = users[context.rng.int(users.length)]!
      const job = context.nextId()
      const commits = context.rng.next() < 0.75
      const withSlot = context.target.supportsSlots
      if (
        withSlot &&
        (await context.step("acquire_slot", () => context.target.acquireSlot(user, job))) !== "ok"
      )
        return true
      let hold: HoldRef = { user, meter: "work", id: job, amount: 100, consumed: 0 }
      if ((await reserveTallied(context, hold)) === "ok") {
        for (const key of ["a", "b"]) {
          await consumeTallied(context, hold, 30, key)
          hold = { ...hold, consumed: hold.consumed + 30 }
        }
        if (commits) await commitTallied(context, hold, 80)
        else await releaseTallied(context, hold)
      }
      if (withSlot) await context.step("release_slot", () => context.target.releaseSlot(user, job))
      return true
    }
  }
}

/** The workload `key`; users are named after `namespace`, so no two bench runs share any. */
export const makeWorkload = (key: WorkloadKey, namespace: string): Workload => {
  switch (key) {
    case "uniform":
      return uniformWorkload(namespace)
    case "hot-granted":
      return hotGrantedWorkload()
    case "hot":
      return hotWorkload()
    case "mix":
      return mixWorkload(namespace)
  }
}

export const isWorkloadKey = (key: string): key is WorkloadKey =>
  (workloadKeys as ReadonlyArray<string>).includes(key)
