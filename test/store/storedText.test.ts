/**
 * src/store/postgres/storedText.ts: identifiers with U+0000 are stored escaped behind a marker, all
 * others as they are. Stored texts never hold U+0000 (Postgres `text` refuses it), the mapping is
 * undone exactly, and two different identifiers never share a stored text.
 */
import fc from "fast-check"
import { describe, expect, it } from "vitest"
import { fromStoredText, toStoredText } from "../../src/store/postgres/storedText.js"
import { assertProperty } from "../support/properties.js"

/** Strings biased to what the escape handles: U+0000, backslashes, the marker, the letter 0. */
const identifierText = fc.oneof(
  fc.string({ unit: fc.constantFrom("\u0000", "\\", "0", "\uffff", "a") }),
  fc.string({ unit: "grapheme" }),
  fc.string({ unit: "binary" }).filter((text) => !/\p{Cs}/u.test(text))
)

describe("stored text of identifiers", () => {
  it.each([
    ["plain", "job-7", "job-7"],
    ["backslashes without U+0000 stay", "a\\0b", "a\\0b"],
    ["U+0000 is escaped behind the marker", "a\u0000b", "\uffffa\\0b"],
    ["a backslash beside U+0000 is escaped too", "\\\u0000", "\uffff\\\\\\0"],
    ["a leading marker is escaped so it cannot pass for one", "\uffff\\0", "\uffff\uffff\\\\0"],
    ["a marker elsewhere stays", "a\uffff", "a\uffff"]
  ])("%s", (_name, identifier, stored) => {
    expect(toStoredText(identifier)).toBe(stored)
    expect(fromStoredText(stored)).toBe(identifier)
  })

  it("round-trips every identifier, stores no U+0000, and maps different identifiers apart", async () => {
    await assertProperty(
      "stored text",
      fc.asyncProperty(identifierText, identifierText, async (left, right) => {
        expect(fromStoredText(toStoredText(left))).toBe(left)
        expect(toStoredText(left).includes("\u0000")).toBe(false)
        expect(toStoredText(left) === toStoredText(right)).toBe(left === right)
      })
    )
  })
})
