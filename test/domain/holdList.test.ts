/**
 * `list_holds` (PROTOCOL.md "Administration"): a user's holds, pending by default, closed ones still
 * remembered, or all; oldest first; at most `limit`, with `more` when there were more. Reads only.
 */
import fc from "fast-check"
import { describe, expect, it } from "vitest"
import type { Command, HoldListState } from "../../src/domain/commands.js"
import { listHolds as listHoldsOf } from "../../src/domain/holdList.js"
import type { HoldListEntry } from "../../src/domain/results.js"
import type { Row } from "./support.js"
import { T0, U, at, checkRow, commit, release, reserve, runRow } from "./support.js"

const listHolds = (state: HoldListState = "pending", limit = 100): Command => ({
  op: "list_holds",
  user: U,
  state,
  limit
})

const entry = (
  id: string,
  createdAfterMs: number,
  fields: Partial<Pick<HoldListEntry, "amount" | "consumed" | "state" | "meter">> = {}
): HoldListEntry => ({
  id,
  meter: fields.meter ?? "analysis",
  amount: fields.amount ?? 1,
  consumed: fields.consumed ?? 0,
  state: fields.state ?? "pending",
  expiresAt: T0 + createdAfterMs + 60_000,
  createdAt: T0 + createdAfterMs
})

/** Holds c (t=0), a (t=1), b (t=2) and d (t=2): d and b share a millisecond. Then a committed at t=5, c released at t=6. */
const given = [
  at(0, reserve("c", 1)),
  at(1, reserve("a", 1)),
  at(2, reserve("d", 1)),
  at(2, reserve("b", 1)),
  at(5, commit("a", 3)),
  at(6, release("c"))
]

const rows: ReadonlyArray<Row> = [
  {
    name: "a user with no holds has an empty list",
    when: listHolds(),
    then: { status: "ok", holds: [], more: false },
    durable: false
  },
  {
    name: "pending by default, oldest first; one millisecond's holds in id order",
    given,
    when: at(7, listHolds()),
    then: { status: "ok", holds: [entry("b", 2), entry("d", 2)], more: false },
    durable: false
  },
  {
    name: "closed: committed and released ones still remembered, oldest first, as they closed",
    given,
    when: at(7, listHolds("closed")),
    then: {
      status: "ok",
      holds: [entry("c", 0, { state: "released" }), entry("a", 1, { state: "committed", consumed: 3 })],
      more: false
    }
  },
  {
    name: "all: both, by creation, not by closing",
    given,
    when: at(7, listHolds("all")),
    then: {
      status: "ok",
      holds: [
        entry("c", 0, { state: "released" }),
        entry("a", 1, { state: "committed", consumed: 3 }),
        entry("b", 2),
        entry("d", 2)
      ],
      more: false
    }
  },
  {
    name: "limit cuts the oldest-first list and says there is more",
    given,
    when: at(7, listHolds("all", 3)),
    then: {
      status: "ok",
      holds: [
        entry("c", 0, { state: "released" }),
        entry("a", 1, { state: "committed", consumed: 3 }),
        entry("b", 2)
      ],
      more: true
    }
  },
  {
    name: "a limit equal to the count is not more",
    given,
    when: at(7, listHolds("pending", 2)),
    then: { status: "ok", holds: [entry("b", 2), entry("d", 2)], more: false }
  },
  {
    name: "limit 1 of the pending ones",
    given,
    when: at(7, listHolds("pending", 1)),
    then: { status: "ok", holds: [entry("b", 2)], more: true }
  },
  {
    name: "a hold past expiresAt is expired first (everything due is applied before the command)",
    given: [at(0, reserve("x", 2)), at(10, reserve("y", 1))],
    when: at(60_000, listHolds("all")),
    then: {
      status: "ok",
      holds: [entry("x", 0, { state: "expired", amount: 2 }), entry("y", 10)],
      more: false
    },
    // The expiry is written; the listing itself is not.
    durable: true
  }
]

describe("list_holds", () => {
  it.each(rows)("$name", (row) => {
    checkRow(row)
  })
})

describe("list_holds: bounded in bytes", () => {
  const id = fc.string({
    // Units of 1 to 4 UTF-8 bytes, JSON escapes of 2 and 6 bytes, and surrogates alone or paired.
    unit: fc.constantFrom("a", "é", "€", "😀", "\u0001", "\n", "\u0008", '"', "\\", "\ud800", "\udc00"),
    minLength: 1,
    maxLength: 40
  })

  it("lists the oldest holds whose JSON fits the bound, each with a comma, and says more when it stopped", () => {
    fc.assert(
      fc.property(
        fc.uniqueArray(fc.record({ id, amount: fc.integer({ min: 1, max: 150 }) }), {
          minLength: 1,
          maxLength: 30,
          selector: (hold) => hold.id
        }),
        fc.nat(),
        fc.constantFrom(-1, 0),
        (holds, cut, offByOne) => {
          const { state } = runRow({
            given: holds.map((hold, index) => at(index, reserve(hold.id, hold.amount))),
            when: listHolds("pending", 1_000)
          })
          const command = { op: "list_holds", user: U, state: "pending", limit: 1_000 } as const
          // The reference: every hold's JSON as JSON.stringify writes it, and a comma.
          const all = listHoldsOf(state, command, Infinity).holds
          expect(all.map((hold) => [hold.id, hold.amount])).toEqual(
            holds.map((hold) => [hold.id, hold.amount])
          )
          const sizes = all.map((hold) => Buffer.byteLength(JSON.stringify(hold)) + 1)
          // A bound exactly at the end of some hold, or one byte short of it: a count off by one byte shows.
          const fitting = cut % (holds.length + 1)
          const bytesMax = sizes.slice(0, fitting).reduce((sum, size) => sum + size, 0) + offByOne
          const listed = listHoldsOf(state, command, bytesMax)
          const expected = offByOne === 0 ? fitting : Math.max(0, fitting - 1)
          expect(listed.holds).toEqual(all.slice(0, expected))
          expect(listed.more).toBe(expected < holds.length)
        }
      ),
      { numRuns: 500 }
    )
  })
})
