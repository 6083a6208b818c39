import fc from "fast-check"
import { describe, expect, it } from "vitest"
import { fnv1a32, fnv1a32OfString, partitionOf } from "../../src/domain/partition.js"

const encoder = new TextEncoder()

/** Any UTF-16 code unit (lone surrogates often), or any whole code point. */
const codeUnitOrPoint = fc.oneof(
  fc.integer({ min: 0, max: 0xffff }).map((code) => String.fromCharCode(code)),
  fc.integer({ min: 0xd800, max: 0xdfff }).map((code) => String.fromCharCode(code)),
  fc.string({ unit: "binary", minLength: 1, maxLength: 1 })
)

describe("partition of a user (PROTOCOL.md: fnv1a32(utf8(user)) mod P)", () => {
  it.each([
    // Published FNV-1a 32-bit test vectors.
    ["", 0x811c9dc5],
    ["a", 0xe40c292c],
    ["foobar", 0xbf9cf968]
  ])("fnv1a32(%j) is the published value", (text, expected) => {
    expect(fnv1a32(encoder.encode(text))).toBe(expected)
    expect(fnv1a32OfString(text)).toBe(expected)
  })

  it.each([
    ["two-byte characters", "Zürich-ß"],
    ["three-byte characters", "用户-€"],
    ["a surrogate pair", "user-😀"],
    ["a lone high surrogate", "user-\ud83d"],
    ["a lone low surrogate", "\ude00-user"],
    ["a high surrogate before a non-surrogate", "\ud83dx"]
  ])("hashing the string directly equals hashing TextEncoder's bytes: %s", (_, text) => {
    expect(fnv1a32OfString(text)).toBe(fnv1a32(encoder.encode(text)))
  })

  it("equals TextEncoder's bytes for any string, lone surrogates included", () => {
    fc.assert(
      fc.property(
        fc.string({ unit: codeUnitOrPoint, maxLength: 64 }),
        fc.integer({ min: 1, max: 1_024 }),
        (text, partitions) => {
          expect(fnv1a32OfString(text)).toBe(fnv1a32(encoder.encode(text)))
          expect(partitionOf(text, partitions)).toBe(fnv1a32(encoder.encode(text)) % partitions)
        }
      ),
      { numRuns: 2_000 }
    )
  })
})
