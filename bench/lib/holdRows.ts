/**
 * Hold-shaped rows for the Postgres floors (ceilings.ts, durableEchoServer.ts): the table of the
 * coordinator's holds with its primary key and no other index, and one `unnest` insert of N rows.
 */

/** Creates `schema` with a `holds` table shaped like the coordinator's. */
export const holdTableDdl = (schema: string): string => `
  create schema ${schema};
  create table ${schema}.holds (
    user_id text not null, id text not null, meter text not null, amount bigint not null,
    consumed bigint not null, state text not null, expires_at bigint not null, created_at bigint not null,
    closed_at bigint, partition integer not null, primary key (user_id, id)
  )`

/** Inserts one pending hold per ($1 user, $2 id) pair, created at $3 (epoch ms). */
export const holdInsertText = (schema: string): string => `
  insert into ${schema}.holds
  select u, i, 'work', 10, 0, 'pending', $3::bigint + 3600000, $3::bigint, null, 0
  from unnest($1::text[], $2::text[]) as t(u, i)`

/** The arrays for `holdInsertText`: `rows` new (user, id) pairs, ids numbered on from `sequence`. */
export const holdKeys = (
  rows: number,
  sequence: number
): { users: Array<string>; ids: Array<string>; sequence: number } => {
  const users: Array<string> = []
  const ids: Array<string> = []
  let next = sequence
  for (let index = 0; index < rows; index += 1) {
    next += 1
    users.push(`u${next % 10_000}`)
    ids.push(`h${next}`)
  }
  return { users, ids, sequence: next }
}
