/**
 * Issue 34, item 1: an answer rests only on what the synchronous standby has too.
 *
 * The standby's link stalls; `reserve X` waits in COMMIT for the standby past the store's query timeout
 * and is answered `unavailable` (a doubt). The next load settles the doubt by ending that backend, and
 * Postgres then makes the locally committed transaction visible on the primary although the standby
 * does not have it. Until the standby has it, nothing may be answered from it: not the retry's
 * `exists`, not a `get_usage` that counts it. Once the link heals, the same retry is answered `exists`.
 * And when the primary is lost instead and the synchronous standby promoted, every hold acknowledged
 * before is still there and no user holds more than its limit. A wait for the standby cancelled by
 * someone else (pg_cancel_backend) makes Postgres answer the COMMIT with only a warning: not
 * acknowledged either.
 *
 * Its own Postgres 15 primary and synchronous standby (test/nemesis/standby.ts); the store's query
 * timeout is 1 s, so a COMMIT waiting for the silent standby becomes a doubt within a second.
 */
import { afterAll, describe, expect, it } from "vitest"
import type { Command } from "../../src/domain/commands.js"
import type { Result } from "../../src/domain/results.js"
import type { StandbyPair } from "../nemesis/standby.js"
import { standbyAvailable, startStandbyPair } from "../nemesis/standby.js"
import { commitCommand, reserveCommand } from "../support/commands.js"
import { randomPrefix } from "../support/processes.js"
import { until } from "../support/slowCommit.js"
import type { TestCoordinator } from "../support/standbyFailover.js"
import { coordinatorOn } from "../support/standbyFailover.js"

const partitions = 16
const limit = 5_000 // defaultConfig's `analysis` limit of the default plan
const pairs: Array<StandbyPair> = []
const coordinators: Array<TestCoordinator> = []

afterAll(async () => {
  for (const coordinator of coordinators.reverse()) await coordinator.close().catch(() => undefined)
  for (const pair of pairs) await pair.stop()
})

/** Holds the client was told it has (`reserved` or `exists`), per user: id to amount. */
const acknowledged = new Map<string, Map<string, number>>()

const ask = async (coordinator: TestCoordinator, command: Command): Promise<Result> => {
  const result = await coordinator.submit(command)
  if (command.op === "reserve" && (result.status === "reserved" || result.status === "exists")) {
    const holds = acknowledged.get(command.user) ?? new Map<string, number>()
    holds.set(command.id, command.amount)
    acknowledged.set(command.user, holds)
  }
  return result
}

/** What an answer says is reserved of `analysis` (a hold's answer, or get_usage's). */
const reservedOf = (result: Result): number | undefined => {
  if ("reserved" in result) return result.reserved
  if ("meters" in result) return result.meters.find((meter) => meter.meter === "analysis")?.reserved
  return undefined
}

describe.skipIf(!standbyAvailable())("a doubt settled while the synchronous standby lags", () => {
  it("is answered from only once the standby has it, so a promotion loses nothing acknowledged", async () => {
    const pair = await startStandbyPair()
    pairs.push(pair)
    const prefix = randomPrefix("settlefo")
    const options = { prefix, partitions, queryTimeoutMs: 1_000 }
    const primary = await coordinatorOn(pair.database.url, options)
    coordinators.push(primary)

    // A stall that heals: the doubtful reserve is answered once the standby has it, not before.
    expect((await ask(primary, reserveCommand("healed", "before", 10))).status).toBe("reserved")
    pair.link.silence()
    const doubtfulX = await ask(primary, reserveCommand("healed", "X", 4_000))
    const retryXDuringStall = await ask(primary, reserveCommand("healed", "X", 4_000))
    const usageDuringStall = await ask(primary, { op: "get_usage", user: "healed" })
    pair.link.resume()
    const retryXHealed = await ask(primary, reserveCommand("healed", "X", 4_000))

    // A stall that ends in the primary's loss: the standby is promoted without the doubtful commit.
    expect((await ask(primary, reserveCommand("lost", "before", 10))).status).toBe("reserved")
    pair.link.silence()
    const doubtfulY = await ask(primary, reserveCommand("lost", "Y", 4_000))
    const retryYDuringStall = await ask(primary, reserveCommand("lost", "Y", 4_000))
    await pair.killPrimary()
    await pair.promoteStandby("in place")
    const promoted = await coordinatorOn(pair.standbyUrl, options)
    coordinators.push(promoted)

    // Every hold the client was told it has must still be there: committing it must not be `not_found`.
    const lost: Array<string> = []
    for (const [user, holds] of acknowledged)
      for (const id of holds.keys())
        if ((await ask(promoted, commitCommand(user, id))).status === "not_found") lost.push(`${user}/${id}`)
    // And a client that believes it holds what it was told may ask for the rest of its limit.
    const again = await ask(promoted, reserveCommand("lost", "Y2", 4_000))
    const held = (user: string) =>
      [...(acknowledged.get(user)?.values() ?? [])].reduce((sum, x) => sum + x, 0)

    const figures = {
      doubtful: [doubtfulX.status, doubtfulY.status],
      duringStall: {
        retryX: retryXDuringStall.status,
        retryXReserved: reservedOf(retryXDuringStall),
        getUsage: usageDuringStall.status,
        getUsageReserved: reservedOf(usageDuringStall),
        retryY: retryYDuringStall.status
      },
      afterHeal: { retryX: retryXHealed.status, reserved: reservedOf(retryXHealed) },
      afterPromotion: { lost, reserveY2: again.status },
      heldAgainstLimit: { healed: held("healed"), lost: held("lost") }
    }
    console.log("settle then failover:", JSON.stringify(figures))
    expect(figures).toEqual({
      doubtful: ["unavailable", "unavailable"],
      duringStall: {
        retryX: "unavailable",
        retryXReserved: undefined,
        getUsage: "unavailable",
        getUsageReserved: undefined,
        retryY: "unavailable"
      },
      afterHeal: { retryX: "exists", reserved: 4_010 },
      afterPromotion: { lost: [], reserveY2: "reserved" },
      heldAgainstLimit: { healed: 4_010, lost: 4_010 }
    })
    expect(Math.max(figures.heldAgainstLimit.healed, figures.heldAgainstLimit.lost)).toBeLessThanOrEqual(
      limit
    )
  }, 120_000)

  it("a COMMIT whose wait for the standby is cancelled is not acknowledged, though Postgres answers it", async () => {
    const pair = await startStandbyPair()
    pairs.push(pair)
    const primary = await coordinatorOn(pair.database.url, {
      prefix: randomPrefix("cancelsr"),
      partitions,
      queryTimeoutMs: 2_000
    })
    coordinators.push(primary)
    expect((await ask(primary, reserveCommand("cancelled", "before", 10))).status).toBe("reserved")
    pair.link.silence()
    const answer = ask(primary, reserveCommand("cancelled", "Z", 4_000))
    // An operator (or a tool) cancels what waits for the standby: Postgres answers COMMIT, with a warning.
    await until(
      async () =>
        ((
          await pair.database.pool.query(
            "select pg_cancel_backend(pid) from pg_stat_activity where wait_event = 'SyncRep'"
          )
        ).rowCount ?? 0) > 0,
      "a COMMIT waiting for the standby"
    )
    const cancelled = await answer
    const retryDuringStall = await ask(primary, reserveCommand("cancelled", "Z", 4_000))
    pair.link.resume()
    const retryHealed = await ask(primary, reserveCommand("cancelled", "Z", 4_000))
    const figures = {
      cancelled: cancelled.status,
      retryDuringStall: retryDuringStall.status,
      retryHealed: retryHealed.status
    }
    console.log("a cancelled wait for the standby:", JSON.stringify(figures))
    expect(figures).toEqual({
      cancelled: "unavailable",
      retryDuringStall: "unavailable",
      retryHealed: "exists"
    })
  }, 60_000)
})
