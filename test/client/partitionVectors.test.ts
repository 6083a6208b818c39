/**
 * The partition hash against fixed vectors shared with the Go client (clients/go/partition_test.go
 * reads the same file): both clients must route every user to the partition the coordinator computes.
 */
import { readFileSync } from "node:fs"
import { describe, expect, it } from "vitest"
import { fnv1a32, fnv1a32OfString, partitionOf } from "../../src/domain/partition.js"

interface Vector {
  readonly note: string
  readonly user: string
  readonly fnv1a32: number
  readonly partitions: Readonly<Record<string, number>>
}

const { partitions: vectors } = JSON.parse(
  readFileSync(new URL("../../clients/testdata/vectors.json", import.meta.url), "utf8")
) as { readonly partitions: ReadonlyArray<Vector> }

const encoder = new TextEncoder()

describe("partition vectors shared with the Go client", () => {
  it("has vectors, among them the published FNV-1a ones", () => {
    expect(vectors.length).toBeGreaterThanOrEqual(10)
    const byUser = new Map(vectors.map((vector) => [vector.user, vector.fnv1a32]))
    expect(byUser.get("")).toBe(0x811c9dc5)
    expect(byUser.get("a")).toBe(0xe40c292c)
    expect(byUser.get("foobar")).toBe(0xbf9cf968)
  })

  it.each(vectors.map((vector) => [vector.note, vector] as const))("%s", (_note, vector) => {
    expect(fnv1a32OfString(vector.user)).toBe(vector.fnv1a32)
    expect(fnv1a32(encoder.encode(vector.user))).toBe(vector.fnv1a32)
    for (const [partitions, partition] of Object.entries(vector.partitions)) {
      expect(partitionOf(vector.user, Number(partitions))).toBe(partition)
    }
  })
})
