/**
 * The auditor's invariant checks, independent of any model of the decisions: what must hold of the
 * replies a run received and of the rows the store holds at the end, whatever order things happened in.
 * They return a list of violations (empty when all is well), so a property can print them all.
 *
 * The sources of overage (PROTOCOL.md "The invariant"): consumption or a commit beyond the hold, a
 * positive `adjust`, a lowered limit. A meter to which any of them was applied is "tainted": its rows
 * may stand over the limit. Every grant, tainted or not, must leave its meter within the limit.
 */
import type { Command } from "../../src/domain/commands.js"
import type { Config, Period } from "../../src/domain/config.js"
import type { Result } from "../../src/domain/results.js"
import type { MemoryStore } from "../../src/store/MemoryStore.js"
import { allowedStatuses, periodStartOf } from "./model.js"

export interface Exchange {
  readonly command: Command
  readonly result: Result
}

/** Meters ("user|meter") and users ("user|slots") that acknowledged replies say may stand over their limit. */
export const taintedBy = (exchanges: ReadonlyArray<Exchange>): Set<string> => {
  const tainted = new Set<string>()
  for (const { command, result } of exchanges) {
    const view = result as Partial<{ meter: string; amount: number; consumed: number }>
    if ((result.status === "consumed" || result.status === "committed") && view.meter !== undefined) {
      if ((view.consumed ?? 0) > (view.amount ?? 0)) tainted.add(`${command.user}|${view.meter}`)
    }
    if (command.op === "adjust" && result.status === "adjusted" && command.amount > 0) {
      tainted.add(`${command.user}|${command.meter}`)
    }
    if (command.op === "set_limit" && result.status === "ok") tainted.add(`${command.user}|${command.meter}`)
    if (command.op === "set_plan" && result.status === "ok") {
      // A plan change may lower every limit and the slot count.
      tainted.add(`${command.user}|*`)
    }
  }
  return tainted
}

const isTainted = (tainted: Set<string>, user: string, meter: string): boolean =>
  tainted.has(`${user}|${meter}`) || tainted.has(`${user}|*`)

/** Checks every reply on its own and the retries against each other. */
export const auditReplies = (
  config: Config,
  exchanges: ReadonlyArray<Exchange>,
  options: { readonly overloadedAllowed?: boolean } = {}
): Array<string> => {
  const problems: Array<string> = []
  const once = new Map<string, number>()
  const countOnce = (key: string, what: string): void => {
    const seen = (once.get(`${what}|${key}`) ?? 0) + 1
    once.set(`${what}|${key}`, seen)
    if (seen === 2) problems.push(`${what} answered twice: ${key}`)
  }
  for (const [index, { command, result }] of exchanges.entries()) {
    const where = `#${index} ${JSON.stringify(command)} -> ${JSON.stringify(result)}`
    if (result.status === "overloaded" && options.overloadedAllowed === true) continue
    if (!allowedStatuses[command.op].includes(result.status)) {
      problems.push(`status ${result.status} is not one ${command.op} may answer: ${where}`)
      continue
    }
    if (result.status === "reserved") {
      const view = result as {
        used: number
        reserved: number
        limit: number
        overage: number
        available: number
      }
      if (view.used + view.reserved > view.limit || view.overage !== 0 || view.available < 0) {
        problems.push(`a grant left used + reserved over the limit: ${where}`)
      }
    }
    if (command.op === "acquire_slot" && (result.status === "acquired" || result.status === "exists")) {
      const slot = result as { limit: number | null; held: number }
      if (
        command.user !== "" &&
        slot.limit !== null &&
        slot.held > slot.limit &&
        result.status === "acquired"
      ) {
        problems.push(`a slot grant left held over the limit: ${where}`)
      }
      if (command.user === "" && (slot.limit !== null || slot.held !== 0)) {
        problems.push(`a system job must be limit null, held 0: ${where}`)
      }
    }
    if (result.status === "busy") {
      const retryAfterMs = (result as { retryAfterMs?: number }).retryAfterMs
      const { snoozeBaseMs, snoozeJitterMs } = config.fairness
      if (
        retryAfterMs === undefined ||
        retryAfterMs < snoozeBaseMs ||
        retryAfterMs >= snoozeBaseMs + Math.max(1, snoozeJitterMs)
      ) {
        problems.push(`busy's retryAfterMs outside [base, base + jitter): ${where}`)
      }
    }
    // Nothing applied twice: each id, key and hold transition is acknowledged at most once.
    if (command.op === "reserve" && result.status === "reserved") {
      countOnce(`${command.user}|${command.id}`, "reserve")
    }
    if (command.op === "consume" && result.status === "consumed") {
      countOnce(`${command.user}|${command.id}|${command.key}`, "consume key")
    }
    if (command.op === "commit" && result.status === "committed")
      countOnce(`${command.user}|${command.id}`, "commit")
    if (command.op === "release" && result.status === "released")
      countOnce(`${command.user}|${command.id}`, "release")
    if (command.op === "adjust" && result.status === "adjusted")
      countOnce(`${command.user}|${command.id}`, "adjust")
  }
  return problems
}

const periodOf = (config: Config, meter: string): Period =>
  config.meters.find((entry) => entry.name === meter)?.period ?? "none"

/**
 * Checks the durable rows: nothing charged twice, the running totals equal the ledger, and every meter
 * not tainted is within its limit (used this period + the rest of its pending holds), slots within the plan.
 */
export const auditStore = (
  config: Config,
  store: MemoryStore,
  now: number,
  tainted: Set<string>
): Array<string> => {
  const problems: Array<string> = []
  if (store.duplicateLedgerKeys() !== 0)
    problems.push(`ledger keys applied twice: ${store.duplicateLedgerKeys()}`)
  for (const [user, rows] of store.rows) {
    const sums = new Map<string, number>()
    for (const entry of rows.ledger) {
      const key = `${entry.meter}|${entry.periodStart}`
      sums.set(key, (sums.get(key) ?? 0) + entry.delta)
    }
    for (const [key, sum] of sums) {
      const total = rows.usage.get(key)?.used
      if (total !== sum)
        problems.push(`${user} ${key}: ledger sums to ${sum}, usage row says ${String(total)}`)
    }
    for (const [key, row] of rows.usage) {
      if (!sums.has(key) && row.used !== 0)
        problems.push(`${user} ${key}: usage ${row.used} without ledger rows`)
      if (row.used < 0) problems.push(`${user} ${key}: usage below 0 (${row.used})`)
    }
    const plan = rows.plan ?? config.defaultPlan
    for (const { name } of config.meters) {
      if (isTainted(tainted, user, name)) continue
      const limit = rows.limits.get(name) ?? config.plans[plan]?.limits[name] ?? 0
      // A period never goes back: with the clock stepped back, the latest period with a row is current.
      let current = periodStartOf(periodOf(config, name), now)
      for (const row of rows.usage.values())
        if (row.meter === name && current !== null && row.periodStart !== null && row.periodStart > current)
          current = row.periodStart
      const used = rows.usage.get(`${name}|${current}`)?.used ?? 0
      let reserved = 0
      for (const hold of rows.holds.values()) {
        if (hold.meter === name && hold.state === "pending" && hold.expiresAt > now) {
          reserved += Math.max(0, hold.amount - hold.consumed)
        }
      }
      if (used + reserved > limit) {
        problems.push(`${user}/${name}: durable used ${used} + reserved ${reserved} > limit ${limit}`)
      }
    }
    const slotLimit = config.fairness.enabled ? (config.plans[plan]?.slots ?? 0) : null
    if (slotLimit !== null && !isTainted(tainted, user, "*") && rows.slots.size > slotLimit) {
      problems.push(`${user}: ${rows.slots.size} slots held > plan's ${slotLimit}`)
    }
  }
  return problems
}
