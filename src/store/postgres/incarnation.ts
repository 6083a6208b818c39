/**
 * The database's incarnation: which history of the database a row was written in (migration 0011,
 * `database_incarnation()`). A counter kept in a table goes back with the history: a promoted standby
 * resumes a sequence from the last value it received, a restore from the dump's. So anything that must
 * stay unique across promotions and restores (an event id) is made of the counter and the incarnation
 * stamped into the row at insert: the incarnation changes at every promotion (the timeline), every
 * start of the server (a restart, a copy of the files started elsewhere, another cluster) and with the
 * table's file (pg_restore --clean, a restore into a new database, TRUNCATE).
 *
 * Self-contained so that any row that carries ids can take it: its SQL in the insert, its text in the id.
 */

/**
 * The incarnation of rows inserted into `table` of `schema`, as SQL for the insert: a scalar subquery,
 * computed once per statement, not per row.
 */
export const incarnationSql = (schema: string, table: string): string =>
  `(select "${schema}".database_incarnation('"${schema}"."${table}"'::regclass))`

/**
 * The incarnation as ids carry it: the stored bigint (as pg returns it, decimal text) as an unsigned
 * number in base 36, at most 13 characters. Null (a row recorded before migration 0011): "".
 */
export const incarnationText = (stored: string | null): string =>
  stored === null ? "" : BigInt.asUintN(64, BigInt(stored)).toString(36)
