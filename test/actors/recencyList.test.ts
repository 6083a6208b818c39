/**
 * The recency list against a small model (an array, least recently used first): after any sequence
 * of touches and removals, walking the list from its oldest entry, and back from the newest, gives
 * exactly the model's order.
 */
import fc from "fast-check"
import { describe, expect, it } from "vitest"
import type { RecencyLinks } from "../../src/actors/RecencyList.js"
import { RecencyList } from "../../src/actors/RecencyList.js"
import { propertyParameters } from "../support/properties.js"

interface Entry extends RecencyLinks<Entry> {
  readonly key: number
}

const entry = (key: number): Entry => ({ key, newer: undefined, older: undefined })

const oldestFirst = (list: RecencyList<Entry>): Array<number> => {
  const keys: Array<number> = []
  for (let at = list.oldest; at !== undefined; at = at.newer) keys.push(at.key)
  return keys
}

/** Walks back from the newest entry (found from the oldest), so the `older` links are checked too. */
const newestFirst = (list: RecencyList<Entry>): Array<number> => {
  let newest = list.oldest
  while (newest?.newer !== undefined) newest = newest.newer
  const keys: Array<number> = []
  for (let at = newest; at !== undefined; at = at.older) keys.push(at.key)
  return keys
}

type Operation =
  { readonly kind: "touch"; readonly key: number } | { readonly kind: "remove"; readonly key: number }

const operation: fc.Arbitrary<Operation> = fc.oneof(
  { weight: 3, arbitrary: fc.record({ kind: fc.constant("touch" as const), key: fc.nat(12) }) },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant("remove" as const), key: fc.nat(12) }) }
)

describe("RecencyList", () => {
  it.each([
    { steps: "touch 1, 2, 3", touches: [1, 2, 3], removes: [], order: [1, 2, 3] },
    { steps: "touching the oldest moves it last", touches: [1, 2, 3, 1], removes: [], order: [2, 3, 1] },
    { steps: "touching the newest keeps the order", touches: [1, 2, 3, 3], removes: [], order: [1, 2, 3] },
    { steps: "removing the middle entry", touches: [1, 2, 3], removes: [2], order: [1, 3] },
    { steps: "removing the only entry", touches: [1], removes: [1], order: [] },
    { steps: "removing an entry not in the list", touches: [1], removes: [5], order: [1] }
  ])("$steps", ({ touches, removes, order }) => {
    const entries = new Map<number, Entry>()
    const of = (key: number) => entries.get(key) ?? entries.set(key, entry(key)).get(key)!
    const list = new RecencyList<Entry>()
    for (const key of touches) list.touch(of(key))
    for (const key of removes) list.remove(of(key))
    expect(oldestFirst(list)).toEqual(order)
    expect(newestFirst(list)).toEqual([...order].reverse())
    expect(list.size).toBe(order.length)
  })

  it("orders entries by last touch, whatever the sequence of touches and removals", () => {
    fc.assert(
      fc.property(fc.array(operation, { maxLength: 300 }), (operations) => {
        const entries = Array.from({ length: 13 }, (_, key) => entry(key))
        const list = new RecencyList<Entry>()
        let model: Array<number> = []
        for (const step of operations) {
          model = model.filter((key) => key !== step.key)
          if (step.kind === "touch") {
            list.touch(entries[step.key]!)
            model.push(step.key)
          } else {
            list.remove(entries[step.key]!)
          }
          expect(oldestFirst(list)).toEqual(model)
          expect(newestFirst(list)).toEqual([...model].reverse())
          expect(list.size).toBe(model.length)
          for (const candidate of entries) expect(list.has(candidate)).toBe(model.includes(candidate.key))
        }
      }),
      propertyParameters()
    )
  })
})
