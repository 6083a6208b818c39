/**
 * Table-driven tests of `decide`: a row names a case of PROTOCOL.md, the commands that set it up, the
 * command under test and the exact result the protocol asks for. Rows read like the protocol's tables.
 */
import { expect } from "vitest"
import type { Command } from "../../src/domain/commands.js"
import type { Config } from "../../src/domain/config.js"
import { defaultConfig } from "../../src/domain/config.js"
import type { Decision } from "../../src/domain/decide.js"
import { decide } from "../../src/domain/decide.js"
import type { Result } from "../../src/domain/results.js"
import type { UserState } from "../../src/domain/state.js"
import { emptyUserState } from "../../src/domain/state.js"

/** 2026-03-10T12:00:00Z, mid-month: rows that cross a period boundary say so with their own `at`. */
export const T0 = Date.UTC(2026, 2, 10, 12)
export const U = "u1"
export const MAX = Number.MAX_SAFE_INTEGER

/** A step of a row: a command decided `at` ms after T0 (default 0). */
export interface Step {
  readonly command: Command
  readonly at?: number
}

export const at = (ms: number, command: Command): Step => ({ command, at: ms })

type Given = Command | Step

const toStep = (given: Given): Step => ("command" in given ? given : { command: given })

export interface Row {
  readonly name: string
  readonly given?: ReadonlyArray<Given>
  readonly when: Given
  /** The exact result. A slot result's `job` echo is checked against the command and not listed. */
  readonly then: Result | null
  /** Whether the decision asks the store to make something durable. */
  readonly durable?: boolean
  /** Replies to earlier waiting acquire_slot callers this decision sends, by job. */
  readonly wakes?: Record<string, Result>
  readonly config?: Config
  /** ctx.random for `busy`'s jitter; default 0.5. */
  readonly random?: number
}

export interface Run {
  readonly state: UserState
  readonly decision: Decision
  /** Every result of the given steps, in order. */
  readonly givenResults: ReadonlyArray<Result | null>
}

/** Decides the given steps, then the step under test, on one user's fresh state; assertFull recounts after each. */
export const runRow = (row: Pick<Row, "given" | "when" | "config" | "random">): Run => {
  const config = row.config ?? defaultConfig
  const random = row.random ?? 0.5
  const state = emptyUserState(U)
  const ctxAt = (step: Step) => ({ config, now: T0 + (step.at ?? 0), random: () => random })
  const givenResults = (row.given ?? []).map(toStep).map((step) => {
    const decision = decide(state, step.command, ctxAt(step), { assertFull: true })
    return decision.result
  })
  const when = toStep(row.when)
  const decision = decide(state, when.command, ctxAt(when), { assertFull: true })
  return { state, decision, givenResults }
}

/** A slot result's `job` must be the command's job; the rest is compared exactly. */
const withoutJob = (result: Result | null, job: string | undefined): unknown => {
  if (result === null || !("job" in result) || result.job === undefined) return result
  expect(result.job).toBe(job)
  const { job: _job, ...rest } = result
  return rest
}

export const checkRow = (row: Row): Run => {
  const run = runRow(row)
  const when = toStep(row.when).command
  for (const [index, result] of run.givenResults.entries()) {
    // A setup step must be accepted; a row that tests a rejection puts it in `when`.
    expect(
      ["invalid_request", "unavailable", "overloaded", "limit_reached"],
      `given #${index} answered ${JSON.stringify(result)}`
    ).not.toContain(result?.status)
  }
  expect(withoutJob(run.decision.result, "job" in when ? when.job : undefined)).toEqual(row.then)
  if (row.durable !== undefined) {
    expect(run.decision.events.length > 0, `events: ${JSON.stringify(run.decision.events)}`).toBe(row.durable)
  }
  const wakes = Object.fromEntries(
    run.decision.wakeups.map((wake) => [wake.job, withoutJob(wake.result, wake.job)])
  )
  expect(wakes).toEqual(row.wakes ?? {})
  return run
}

// Commands of user U, defaults as the transport applies them.
export const reserve = (id: string, amount: number, meter = "analysis", ttlMs = 60_000): Command => ({
  op: "reserve",
  user: U,
  meter,
  amount,
  id,
  ttlMs
})
export const consume = (id: string, amount: number, key: string): Command => ({
  op: "consume",
  user: U,
  id,
  amount,
  key
})
export const commit = (id: string, amount?: number): Command => ({ op: "commit", user: U, id, amount })
export const release = (id: string): Command => ({ op: "release", user: U, id })
export const extend = (id: string, ttlMs: number): Command => ({ op: "extend", user: U, id, ttlMs })
export const adjust = (id: string, amount: number, meter = "analysis"): Command => ({
  op: "adjust",
  user: U,
  meter,
  amount,
  id
})
export const acquire = (
  job: string,
  options: { leaseMs?: number; waitMs?: number; user?: string } = {}
): Command => ({
  op: "acquire_slot",
  user: options.user ?? U,
  job,
  leaseMs: options.leaseMs ?? 120_000,
  waitMs: options.waitMs ?? 0
})
export const renew = (job: string, leaseMs = 120_000, user = U): Command => ({
  op: "renew_slot",
  user,
  job,
  leaseMs
})
export const releaseSlot = (job: string, user = U): Command => ({ op: "release_slot", user, job })
export const getUsage = (): Command => ({ op: "get_usage", user: U })
export const setPlan = (plan: string): Command => ({ op: "set_plan", user: U, plan })
export const setLimit = (meter: string, limit: number | null): Command => ({
  op: "set_limit",
  user: U,
  meter,
  limit
})
export const tick = (): Command => ({ op: "tick", user: U })

/** A meter's state in a result: available = limit - used - reserved, overage = max(0, used + reserved - limit). */
export const meter = (name: string, limit: number, used: number, reserved: number) => ({
  meter: name,
  limit,
  used,
  reserved,
  available: limit - used - reserved,
  overage: Math.max(0, used + reserved - limit)
})

export const hold = (
  id: string,
  amount: number,
  consumed: number,
  state: "pending" | "committed" | "released" | "expired",
  expiresAt: number
) => ({ id, amount, consumed, state, expiresAt })

/** A hold result: status, the meter's state after the decision, the hold. */
export const holdResult = (
  status: string,
  meterState: ReturnType<typeof meter>,
  holdState: ReturnType<typeof hold>
): Result => ({ status, ...meterState, ...holdState }) as Result
