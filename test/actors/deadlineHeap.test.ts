/**
 * The deadline heap against a small model (a Map of key -> deadline): after any sequence of sets,
 * deletes and pops, the heap holds exactly the model's entries and pops them earliest first.
 */
import fc from "fast-check"
import { describe, expect, it } from "vitest"
import { DeadlineHeap } from "../../src/actors/DeadlineHeap.js"
import { propertyParameters } from "../support/properties.js"

type Operation =
  | { readonly kind: "set"; readonly key: number; readonly at: number }
  | { readonly kind: "delete"; readonly key: number }
  | { readonly kind: "pop" }

// Mostly sets, so heaps grow deep enough for a delete in one subtree to need the last entry sifted up.
const operation: fc.Arbitrary<Operation> = fc.oneof(
  {
    weight: 5,
    arbitrary: fc.record({ kind: fc.constant("set" as const), key: fc.nat(60), at: fc.nat(1_000) })
  },
  { weight: 2, arbitrary: fc.record({ kind: fc.constant("delete" as const), key: fc.nat(60) }) },
  { weight: 1, arbitrary: fc.constant({ kind: "pop" as const }) }
)

describe("DeadlineHeap", () => {
  it("moves the last entry up when it replaces a deleted one deeper in another subtree", () => {
    // Heap by position: 1, 10, 2, 11, 12, 3, 4. Deleting 11 puts 4 under 10: it must rise above it.
    const heap = new DeadlineHeap<string>()
    for (const at of [1, 10, 2, 11, 12, 3, 4]) heap.set(`key-${at}`, at)
    heap.delete("key-11")
    expect(heap.isValid()).toBe(true)
    const drained: Array<number> = []
    for (let entry = heap.pop(); entry !== undefined; entry = heap.pop()) drained.push(entry.at)
    expect(drained).toEqual([1, 2, 3, 4, 10, 12])
  })

  it("keeps one entry per key and pops the earliest deadline, whatever the order of sets, deletes and pops", () => {
    fc.assert(
      fc.property(fc.array(operation, { maxLength: 400 }), (operations) => {
        const heap = new DeadlineHeap<number>()
        const model = new Map<number, number>()
        for (const step of operations) {
          if (step.kind === "set") {
            heap.set(step.key, step.at)
            model.set(step.key, step.at)
          } else if (step.kind === "delete") {
            expect(heap.delete(step.key)).toBe(model.delete(step.key))
          } else {
            const popped = heap.pop()
            if (model.size === 0) {
              expect(popped).toBeUndefined()
              continue
            }
            const earliest = Math.min(...model.values())
            expect(popped?.at).toBe(earliest)
            expect(model.get(popped!.key)).toBe(earliest)
            model.delete(popped!.key)
          }
          expect(heap.isValid()).toBe(true)
          expect(heap.size).toBe(model.size)
          for (const [key, at] of model) expect(heap.get(key)).toBe(at)
        }
        const drained: Array<number> = []
        for (let entry = heap.pop(); entry !== undefined; entry = heap.pop()) drained.push(entry.at)
        expect(drained).toEqual([...model.values()].sort((left, right) => left - right))
      }),
      propertyParameters()
    )
  })
})
