/**
 * Postgres array literals for the `unnest` parameters of a group's statements, built in one pass.
 * `pg` would build the same text itself (utils.js `arrayString`), but by string concatenation with two
 * regular-expression replaces per element: in the coordinator's allocation profile that was a quarter
 * of every byte allocated, and its cost grows with each group. The server parses the text the same
 * way whichever builds it (test/store/arrayLiteral.test.ts compares the two).
 */

/** Characters that must be escaped inside a quoted array element. */
const needsEscape = /["\\]/
const escapeAll = /["\\]/g

const quoted = (text: string): string =>
  needsEscape.test(text) ? `"${text.replace(escapeAll, "\\$&")}"` : `"${text}"`

/** Whether every value is a string with nothing to escape: the literal is then one `join`. */
const allPlainText = (values: ReadonlyArray<string | null>): boolean => {
  for (let index = 0; index < values.length; index += 1) {
    const value = values[index]
    if (typeof value !== "string" || needsEscape.test(value)) return false
  }
  return true
}

/** `{"a","b",NULL}`: every element quoted, so commas, braces, spaces and the word NULL stay text. */
export const textArrayLiteral = (values: ReadonlyArray<string | null>): string => {
  // The common case (ids, meters, states): no element string of its own, no parts array.
  if (values.length > 0 && allPlainText(values)) return `{"${values.join('","')}"}`
  const parts = new Array<string>(values.length)
  for (let index = 0; index < values.length; index += 1) {
    const value = values[index]
    // undefined as NULL, as pg does; the columns' NOT NULL constraints refuse it where it matters.
    parts[index] = value === null || value === undefined ? "NULL" : quoted(value)
  }
  return `{${parts.join(",")}}`
}

/**
 * `{1,-2,NULL}` for bigint[] and integer[] columns. Every value is a safe integer by the domain's
 * invariants; anything else is a bug, and throwing fails the group instead of storing a rounded number.
 */
export const integerArrayLiteral = (values: ReadonlyArray<number | null>): string => {
  let plain = true
  for (let index = 0; index < values.length && plain; index += 1) plain = Number.isSafeInteger(values[index])
  if (plain) return `{${values.join(",")}}`
  const parts = new Array<string>(values.length)
  for (let index = 0; index < values.length; index += 1) {
    const value = values[index]
    if (value === null || value === undefined) {
      parts[index] = "NULL"
      continue
    }
    if (!Number.isSafeInteger(value)) throw new Error(`${String(value)} is not a safe integer`)
    parts[index] = String(value)
  }
  return `{${parts.join(",")}}`
}
