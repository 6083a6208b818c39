/** Number formats shared by the report's sections. */

/** Rates: whole numbers with thousands separators from 100 up, one decimal below. */
export const formatRate = (value: number): string =>
  value >= 100 ? Math.round(value).toLocaleString("en-US") : value.toFixed(1)

/** Milliseconds: three significant digits or so. */
export const formatMs = (value: number): string =>
  value >= 100 ? value.toFixed(0) : value >= 10 ? value.toFixed(1) : value.toFixed(2)

/** A Markdown table: the header's cells, a rule, then one row per entry. */
export const table = (
  head: ReadonlyArray<string>,
  rows: ReadonlyArray<ReadonlyArray<string | number>>
): Array<string> => [
  `| ${head.join(" | ")} |`,
  `|${" --- |".repeat(head.length)}`,
  ...rows.map((row) => `| ${row.join(" | ")} |`)
]
