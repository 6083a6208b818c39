/**
 * The independent tally that checks every target: per (user, meter) a lower bound of what the system
 * holds (`used + reserved`), kept from the workload's side of the wire.
 *
 * Why a lower bound: a grant is added when its reply arrives (after the system made it); anything that
 * gives quota back (commit, release, consume moving reserved to used) is subtracted when its request is
 * *sent* (before the system applies it), and usage is added when the reply arrives. So at every moment
 * the tally is at most the system's true `used + reserved`. When a grant arrives and the tally, with it,
 * is above the limit, the system's own sum was above the limit at that moment: an over-grant, never a
 * false alarm. (It may miss some over-grants; the count is a floor.) Sound because no workload commits
 * more than its hold's amount, so only grants raise the sum.
 */
import type { MeterName } from "../targets/Target.js"
import { meterLimits } from "../targets/Target.js"

interface Account {
  used: number
  reserved: number
}

export interface Tally {
  /** A grant's reply arrived. Returns true when it is an over-grant. */
  readonly granted: (user: string, meter: MeterName, amount: number) => boolean
  /** A request that returns `amount` from reserved is about to be sent. */
  readonly returning: (user: string, meter: MeterName, amount: number) => void
  /** A reply confirmed `amount` of usage (consume, commit). */
  readonly charged: (user: string, meter: MeterName, amount: number) => void
  readonly overGrants: () => number
}

export const makeTally = (): Tally => {
  const accounts = new Map<string, Account>()
  let overGrants = 0
  const accountOf = (user: string, meter: MeterName): Account => {
    const key = `${meter}\u0000${user}`
    let account = accounts.get(key)
    if (account === undefined) {
      account = { used: 0, reserved: 0 }
      accounts.set(key, account)
    }
    return account
  }
  return {
    granted: (user, meter, amount) => {
      const account = accountOf(user, meter)
      account.reserved += amount
      const over = account.used + account.reserved > meterLimits[meter]
      if (over) overGrants += 1
      return over
    },
    returning: (user, meter, amount) => {
      accountOf(user, meter).reserved -= amount
    },
    charged: (user, meter, amount) => {
      accountOf(user, meter).used += amount
    },
    overGrants: () => overGrants
  }
}
