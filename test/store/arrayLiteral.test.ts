/**
 * The array literals the store sends for its `unnest` parameters read back from Postgres as the
 * arrays they were made from, and are the same text `pg` would have built from those arrays.
 */
import { createRequire } from "node:module"
import fc from "fast-check"
import { afterAll, describe, expect, it } from "vitest"
import { integerArrayLiteral, textArrayLiteral } from "../../src/store/postgres/arrayLiteral.js"
import { createTestSchema } from "../support/database.js"
import { assertProperty, propertyParameters } from "../support/properties.js"

const database = createTestSchema("array_literal")
const pool = database.pool({ max: 1 })
afterAll(() => database.drop())

// pg's own encoding of an array parameter (pg/lib/utils.js, CommonJS without types): the reference.
const pgUtils = createRequire(import.meta.url)("pg/lib/utils") as {
  readonly prepareValue: (value: unknown) => unknown
}
const pgEncoded = (values: ReadonlyArray<unknown>): unknown => pgUtils.prepareValue([...values])

/** Text Postgres can store (no NUL), biased to the characters an array literal has to escape. */
const storableText = fc
  .oneof(
    fc.string({ unit: fc.constantFrom('"', "\\", ",", "{", "}", " ", "a", "N", "U", "L", "'", "\n") }),
    fc.string({ unit: "grapheme" }),
    fc.constantFrom("", "NULL", "null", " padded ", "a,b", '{"x"}')
  )
  .filter((text) => !text.includes("\u0000"))

const textArrays = fc.array(fc.option(storableText, { nil: null }), { maxLength: 20 })
const integerArrays = fc.array(
  fc.option(fc.integer({ min: Number.MIN_SAFE_INTEGER, max: Number.MAX_SAFE_INTEGER }), { nil: null }),
  { maxLength: 20 }
)

describe("array literals of the store's unnest parameters", () => {
  it("text[]: the same text as pg builds", () => {
    fc.assert(
      fc.property(textArrays, (values) => {
        expect(textArrayLiteral(values)).toBe(pgEncoded(values))
      }),
      propertyParameters(1_000)
    )
  })

  it("bigint[]: the same text as pg builds, less the quotes pg puts around each number", () => {
    fc.assert(
      fc.property(integerArrays, (values) => {
        expect(integerArrayLiteral(values)).toBe(String(pgEncoded(values)).replaceAll('"', ""))
      }),
      propertyParameters(1_000)
    )
  })

  it("text[] and bigint[] read back from Postgres as the arrays they were made from", async () => {
    await assertProperty(
      "array literals round-trip through Postgres",
      fc.asyncProperty(textArrays, integerArrays, async (texts, integers) => {
        const result = await pool.query<{ texts: Array<string | null>; integers: Array<string | null> }>(
          "select $1::text[] as texts, $2::bigint[] as integers",
          [textArrayLiteral(texts), integerArrayLiteral(integers)]
        )
        const row = result.rows[0]!
        expect(row.texts).toEqual(texts)
        expect(row.integers.map((value) => (value === null ? null : Number(value)))).toEqual(integers)
      }),
      propertyParameters(200)
    )
  })

  it.each([
    ["a fraction", 1.5],
    ["an unsafe integer", 2 ** 53],
    ["NaN", Number.NaN],
    ["Infinity", Number.POSITIVE_INFINITY]
  ])("refuses %s in an integer array instead of storing a rounded number", (_, value) => {
    expect(() => integerArrayLiteral([1, value])).toThrow("is not a safe integer")
  })
})
