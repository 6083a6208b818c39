/**
 * Postgres's final state against what the clients were told, once every fault healed, every call
 * resolved and everything due has expired (the flow checks of test/cluster/flows.ts, widened for holds
 * and leases that run out and for a month's end):
 *
 * - checkDatabase: the invariant, every acknowledged grant, commit and release durable, no ledger key
 *   twice, totals equal to the ledger;
 * - each hold row was granted to a client (or its user's call failed), and ended as its flow ended it:
 *   committed when a commit was acknowledged, released likewise, expired when left to run out, consumed
 *   by exactly the consumes acknowledged; none still pending past its expiry;
 * - every acknowledged consume in the ledger with its amount, and no consume nobody was told of;
 * - per user and period, `used` within what the model allows (exactly the changes made, wherever a
 *   change made at the month's end may have counted);
 * - no slot left held: one whose release was answered `not_found` still held is a wrong answer; one
 *   answered `released` an acknowledged release lost; every limit acknowledged stored.
 */
import type pg from "pg"
import { checkDatabase } from "../support/databaseChecks.js"
import { sleep } from "../cluster/cluster.js"
import type { Call } from "./history.js"
import { statusOf } from "./history.js"
import type { NemesisLoad } from "./load.js"
import type { ModelSettings } from "./model.js"
import { changesOf, holdFlowsOf, usedBounds } from "./model.js"
import type { NemesisWorld } from "./world.js"
import { worldNow } from "./world.js"

/** PROTOCOL.md: expiries happen at most a minute late; the wait for them ends there. */
const expiryWaitMsMax = 65_000
/** Holds and leases due within this are the time-driven ones (1-3 s): the wait is for them to end. */
const dueSoonMs = 10_000

/**
 * Waits until every time-driven hold and lease has ended (none pending that is due within the next
 * ten seconds of the world's clock: the long ones are an hour or two minutes away), bounded by the
 * minute PROTOCOL.md allows; how long it took.
 */
export const waitForExpiries = async (world: NemesisWorld): Promise<number> => {
  const started = Date.now()
  const due = async () => {
    const soon = worldNow(world) + dueSoonMs
    const result = await world.database.pool.query<{ holds: string; slots: string }>(
      `select (select count(*) from quota.holds where state = 'pending' and expires_at < $1)::text as holds,
              (select count(*) from quota.slots where lease_expires_at < $1)::text as slots`,
      [soon]
    )
    return Number(result.rows[0]!.holds) + Number(result.rows[0]!.slots)
  }
  while ((await due()) > 0 && Date.now() - started < expiryWaitMsMax) await sleep(500)
  return Date.now() - started
}

const amountOf = (call: Call, field: string) => Number(call.input[field])

export const finalChecks = async (
  pool: pg.Pool,
  load: NemesisLoad,
  model: ModelSettings,
  now: number
): Promise<{ violations: Array<string>; wrong: Array<string> }> => {
  const violations: Array<string> = []
  const wrong: Array<string> = []
  const database = await checkDatabase(pool, load.snapshot())
  violations.push(...database.violations.map((what) => `database: ${what}`))
  const holds = await pool.query<{
    user_id: string
    id: string
    amount: string
    consumed: string
    state: string
    expires_at: string
  }>("select user_id, id, amount::text, consumed::text, state, expires_at::text from quota.holds")
  const ledger = await pool.query<{ user_id: string; hold_id: string; key: string; requested: string }>(
    "select user_id, hold_id, key, requested::text from quota.usage_ledger where operation = 'consume'"
  )
  const applied = new Map(
    ledger.rows.map((row) => [`${row.user_id}/${row.hold_id}/${row.key}`, Number(row.requested)])
  )
  const consumesTold = new Set<string>()
  for (const call of load.calls) {
    if (call.op !== "consume") continue
    const key = `${call.user}/${call.flow}/${call.input["key"]}`
    if (["consumed", "exists"].includes(statusOf(call))) {
      consumesTold.add(key)
      if (applied.get(key) !== amountOf(call, "amount"))
        violations.push(`acknowledged consume ${key} of ${amountOf(call, "amount")} not in the ledger`)
    }
  }
  for (const key of applied.keys()) {
    const user = key.slice(0, key.indexOf("/"))
    if (!consumesTold.has(key) && !load.uncertain.has(user) && load.callsByUser.has(user))
      violations.push(`consume ${key} in the ledger, never acknowledged`)
  }
  const flowsOf = new Map([...load.callsByUser].map(([user, calls]) => [user, holdFlowsOf(calls)]))
  for (const row of holds.rows) {
    const flows = flowsOf.get(row.user_id)
    if (flows === undefined || load.uncertain.has(row.user_id)) continue
    const flow = flows.get(row.id)
    const key = `${row.user_id}/${row.id}`
    if (flow === undefined || !["reserved", "exists", "closed"].includes(statusOf(flow.reserve))) {
      violations.push(`hold ${key} (${row.state}) was never granted to a client`)
      continue
    }
    const ended = flow.calls.filter((call) => call.op === "commit" || call.op === "release").at(-1)
    const wanted =
      ended === undefined || statusOf(ended) === "closed"
        ? "expired"
        : statusOf(ended) === "not_found"
          ? "?"
          : ended.op === "commit"
            ? "committed"
            : "released"
    // A commit answered not_found was judged wrong when it came; nothing more to say of its hold here.
    if (wanted !== "?" && row.state !== wanted)
      violations.push(`hold ${key} is ${row.state}, its flow left it ${wanted}`)
    const consumed = flow.calls
      .filter((call) => call.op === "consume" && ["consumed", "exists"].includes(statusOf(call)))
      .reduce((sum, call) => sum + amountOf(call, "amount"), 0)
    const expectedConsumed = row.state === "committed" ? Number(row.amount) : consumed
    if (Number(row.consumed) !== expectedConsumed)
      violations.push(`hold ${key}: consumed ${row.consumed}, the clients were told ${expectedConsumed}`)
    if (row.state === "pending" && Number(row.expires_at) + 2 * model.clockOffsetMaxMs < now)
      violations.push(`hold ${key} still pending ${now - Number(row.expires_at)} ms past its expiry`)
  }
  // `used`, per user and period, against the model with every call resolved.
  const totals = await pool.query<{ user_id: string; period_start: string; used: string }>(
    "select user_id, period_start::text, used::text from quota.usage_totals where meter = 'analysis'"
  )
  const usedOf = new Map(totals.rows.map((row) => [`${row.user_id}/${row.period_start}`, Number(row.used)]))
  const end = { s: now, r: now }
  for (const [user, calls] of load.callsByUser) {
    if (load.uncertain.has(user)) continue
    const changes = changesOf(flowsOf.get(user)!)
    for (const period of model.monthEndAt === undefined
      ? (["before"] as const)
      : (["before", "after"] as const)) {
      const start = period === "after" ? model.monthEndAt! : model.periodBefore
      const used =
        start === undefined
          ? totals.rows.filter((row) => row.user_id === user).reduce((sum, row) => sum + Number(row.used), 0)
          : (usedOf.get(`${user}/${start}`) ?? 0)
      const { min, max } = usedBounds(calls, changes, end, period, model)
      if (used < min || used > max)
        violations.push(
          `${user}: used ${used} ${period} the month's end, the clients were told ${min}..${max}`
        )
    }
  }
  const slots = await pool.query<{ user_id: string; job: string }>("select user_id, job from quota.slots")
  for (const row of slots.rows) {
    const release = load.callsByUser
      .get(row.user_id)
      ?.find((call) => call.op === "release_slot" && call.flow === row.job)
    if (release === undefined || load.uncertain.has(row.user_id)) continue
    if (statusOf(release) === "not_found")
      wrong.push(
        `release_slot ${row.user_id} ${row.job}: answered not_found, the slot is still held in Postgres`
      )
    else if (statusOf(release) === "released")
      violations.push(`acknowledged release of slot ${row.user_id}/${row.job} lost`)
  }
  const limits = await pool.query<{ user_id: string; limit_value: string }>(
    "select user_id, limit_value::text from quota.user_limits where meter = 'analysis'"
  )
  const stored = new Map(limits.rows.map((row) => [row.user_id, Number(row.limit_value)]))
  for (const [user, limit] of load.limits)
    if (stored.get(user) !== limit)
      violations.push(`acknowledged limit ${limit} of ${user} not stored: ${stored.get(user)}`)
  return { violations, wrong }
}
