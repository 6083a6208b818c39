/** Postgres bigints come back from `pg` as text; amounts and times are at most 2^53-1, so exact here. */

/** A bigint `pg` returned as text, as a JS number; it must be exact. */
export const toSafeInteger = (text: string): number => {
  const value = Number(text)
  if (!Number.isSafeInteger(value)) throw new Error(`${text} is not a safe integer`)
  return value
}

export const toSafeIntegerOrNull = (text: string | null): number | null =>
  text === null ? null : toSafeInteger(text)
