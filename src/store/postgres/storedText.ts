/**
 * Identifiers (users, hold ids, consume keys, adjust ids, jobs) may hold any Unicode text the protocol
 * allows, U+0000 included, but Postgres `text` cannot store U+0000. So an identifier containing it is
 * stored escaped, behind a marker; every other identifier is stored as it is, which is nearly all of
 * them. Rows written before this existed were stored as they are; migration 0005 rewrote those that
 * started with the marker into this form.
 *
 * The mapping is one to one: a stored text starts with the marker exactly when it was escaped (an
 * identifier that itself starts with the marker is escaped too), and the escape (`\` -> `\\`,
 * U+0000 -> `\0`) is undone unambiguously. Equal identifiers map to equal texts, so keys, unique
 * indexes and joins on these columns mean what they meant.
 */

/** U+FFFF, a noncharacter: valid UTF-8 and valid in `text`, and no identifier in practice starts with it. */
const escapedMarker = "\uffff"

/* eslint-disable no-control-regex -- U+0000 is exactly what these expressions are about */

/** The text to store for `identifier`. */
export const toStoredText = (identifier: string): string =>
  identifier.includes("\u0000") || identifier.startsWith(escapedMarker)
    ? escapedMarker + identifier.replace(/\\/g, "\\\\").replace(/\u0000/g, "\\0")
    : identifier

/** Whether `stored` is an escaped identifier, which fromStoredText changes; nearly none is. */
export const isEscapedText = (stored: string): boolean => stored.startsWith(escapedMarker)

/** The identifier `stored` was made from (toStoredText's inverse). */
export const fromStoredText = (stored: string): string =>
  isEscapedText(stored)
    ? stored
        .slice(escapedMarker.length)
        .replace(/\\(\\|0)/g, (_, escaped: string) => (escaped === "0" ? "\u0000" : "\\"))
    : stored

/** toStoredText of a nullable column value. */
export const toStoredTextOrNull = (identifier: string | null): string | null =>
  identifier === null ? null : toStoredText(identifier)
