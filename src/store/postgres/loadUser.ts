/**
 * Loading users: everything an actor needs, in one statement and one round trip for many users at once
 * (the cold start of a partition touches thousands). Each part is a json_agg subselect; bigint values
 * come back as JSON numbers, exact up to 2^53-1.
 */
import type { HoldRecord, RecalledIds, StoredUser } from "../../domain/events.js"
import { consumeKeyClockSlackMs } from "../../domain/limits.js"
import { fromStoredText, isEscapedText } from "./storedText.js"
import { periodNoneSentinel } from "./writeEvents.js"

/**
 * A hold row as JSON, with its consume keys (those applied since the hold was created, found through
 * usage_ledger_consume_keys).
 */
const holdJson = (schema: string, hold: string, user: string): string => `json_build_object(
  'id', ${hold}.id, 'meter', ${hold}.meter, 'amount', ${hold}.amount, 'consumed', ${hold}.consumed,
  'state', ${hold}.state, 'expiresAt', ${hold}.expires_at, 'createdAt', ${hold}.created_at,
  'closedAt', ${hold}.closed_at,
  'consumeKeys', coalesce((
    select json_agg(entry.key)
    from "${schema}".usage_ledger as entry
    where entry.user_id = ${user} and entry.operation = 'consume' and entry.hold_id = ${hold}.id
      -- Only this incarnation's keys (a hold id reused after retention starts with none), with a slack
      -- for a clock that read earlier than the hold's creation when the key was applied.
      and entry.at >= ${hold}.created_at - ${consumeKeyClockSlackMs}
  ), '[]'::json))`

/**
 * $1 the users (text[], distinct), $2 the retention cutoff (now - idRetentionMs), $3 how many closed
 * holds and adjust ids to read per user (loadRememberedIdsPerUserMax + 1, see storedUserFromRow): one
 * row per user, with `user_id`. Closed holds and adjust ids older than the cutoff are forgotten.
 */
export const loadUsersSql = (schema: string): string => `
  select wanted.user_id, loaded.*
  from unnest($1::text[]) as wanted (user_id)
  cross join lateral (
    select
      (select plan from "${schema}".user_plans where user_id = wanted.user_id) as plan,
      (select floor_at from "${schema}".period_floors where user_id = wanted.user_id) as period_floor_at,
      coalesce((
        select json_agg(json_build_object('meter', meter, 'limit', limit_value))
        from "${schema}".user_limits where user_id = wanted.user_id
      ), '[]'::json) as limit_overrides,
      coalesce((
        select json_agg(json_build_object(
          'meter', latest.meter,
          'periodStart', nullif(latest.period_start, ${periodNoneSentinel}),
          'used', latest.used,
          'thresholdsCrossed', latest.thresholds_crossed))
        from (
          select distinct on (meter) meter, period_start, used, thresholds_crossed
          from "${schema}".usage_totals where user_id = wanted.user_id
          order by meter, period_start desc
        ) as latest
      ), '[]'::json) as usage,
      coalesce((
        select json_agg(${holdJson(schema, "hold", "wanted.user_id")})
        from (
          -- Every pending hold (a bounded number: pendingHoldsPerUserMax).
          select * from "${schema}".holds
          where user_id = wanted.user_id and closed_at is null and state = 'pending'
          union all
          -- The newest closed ones of the retention window, one more than kept: it says some were left.
          (select * from "${schema}".holds
           where user_id = wanted.user_id and closed_at >= $2 and state <> 'pending'
           order by closed_at desc limit $3)
        ) as hold
      ), '[]'::json) as holds,
      coalesce((
        select json_agg(json_build_object('id', key, 'meter', meter, 'amount', requested, 'at', at) order by at)
        from (
          select key, meter, requested, at from "${schema}".usage_ledger
          where user_id = wanted.user_id and operation = 'adjust' and at >= $2
          order by at desc limit $3
        ) as adjustment
      ), '[]'::json) as adjustments,
      coalesce((
        select json_agg(json_build_object('job', job, 'leaseExpiresAt', lease_expires_at))
        from "${schema}".slots where user_id = wanted.user_id
      ), '[]'::json) as slots
  ) as loaded`

/**
 * $1 the user, $2 hold ids (text[]), $3 adjust ids (text[]), $4 the retention cutoff: the closed holds
 * and adjust ids among them that the store still remembers (Store.recall).
 */
export const recallSql = (schema: string): string => `
  select
    coalesce((
      select json_agg(${holdJson(schema, "hold", "$1")})
      from "${schema}".holds as hold
      where hold.user_id = $1 and hold.id = any($2::text[]) and hold.state <> 'pending' and hold.closed_at >= $4
    ), '[]'::json) as holds,
    coalesce((
      select json_agg(json_build_object('id', key, 'meter', meter, 'amount', requested, 'at', at) order by at)
      from "${schema}".usage_ledger
      where user_id = $1 and operation = 'adjust' and coalesce(hold_id, '') = '' and key = any($3::text[])
        and at >= $4
    ), '[]'::json) as adjustments`

/** A row of recallSql as `pg` parses it. */
export interface RecallRow {
  readonly holds: ReadonlyArray<HoldRecord & { consumeKeys: ReadonlyArray<string> }>
  readonly adjustments: ReadonlyArray<{ id: string; meter: string; amount: number; at: number }>
}

/** A row of loadUsersSql as `pg` parses it (json columns are parsed to values). */
export interface LoadUserRow {
  readonly plan: string | null
  /** bigint as text (pg's default), null when none. */
  readonly period_floor_at: string | null
  readonly limit_overrides: ReadonlyArray<{ meter: string; limit: number }>
  readonly usage: ReadonlyArray<{
    meter: string
    periodStart: number | null
    used: number
    thresholdsCrossed: ReadonlyArray<number>
  }>
  readonly holds: ReadonlyArray<HoldRecord & { consumeKeys: ReadonlyArray<string> }>
  readonly adjustments: ReadonlyArray<{ id: string; meter: string; amount: number; at: number }>
  readonly slots: ReadonlyArray<{ job: string; leaseExpiresAt: number }>
}

/** Identifiers of holds as they were before storage (storedText.ts); the row's objects kept when none is escaped. */
const unescapedHolds = (
  holds: ReadonlyArray<HoldRecord & { consumeKeys: ReadonlyArray<string> }>
): ReadonlyArray<HoldRecord & { consumeKeys: ReadonlyArray<string> }> =>
  holds.some((hold) => isEscapedText(hold.id) || hold.consumeKeys.some(isEscapedText))
    ? holds.map((hold) => ({
        ...hold,
        id: fromStoredText(hold.id),
        consumeKeys: hold.consumeKeys.map(fromStoredText)
      }))
    : holds

const unescapedAdjustments = (
  adjustments: ReadonlyArray<{ id: string; meter: string; amount: number; at: number }>
): ReadonlyArray<{ id: string; meter: string; amount: number; at: number }> =>
  adjustments.some((adjustment) => isEscapedText(adjustment.id))
    ? adjustments.map((adjustment) => ({ ...adjustment, id: fromStoredText(adjustment.id) }))
    : adjustments

/**
 * The row as the actor's StoredUser, its identifiers as they were before storage (storedText.ts).
 * Nearly no identifier is escaped, so the row's objects are kept as they are unless one is: a
 * partition's cold start loads thousands of users. The query reads one closed hold and one adjust id
 * more than `keptMax`: when it found that one, the oldest is dropped and the user is marked truncated
 * (its older ids are recalled on demand).
 */
export const storedUserFromRow = (row: LoadUserRow, keptMax: number): StoredUser => {
  let holds = row.holds
  let adjustments = row.adjustments
  let closedCount = 0
  for (const hold of holds) if (hold.state !== "pending") closedCount += 1
  const holdsTruncated = closedCount > keptMax
  if (holdsTruncated) {
    let oldest: (typeof holds)[number] | undefined
    for (const hold of holds)
      if (hold.state !== "pending" && (oldest === undefined || (hold.closedAt ?? 0) < (oldest.closedAt ?? 0)))
        oldest = hold
    holds = holds.filter((hold) => hold !== oldest)
  }
  const adjustmentsTruncated = adjustments.length > keptMax
  // Ordered by `at`: the first is the oldest.
  if (adjustmentsTruncated) adjustments = adjustments.slice(1)
  return {
    plan: row.plan,
    limitOverrides: row.limit_overrides,
    usage: row.usage,
    holds: unescapedHolds(holds),
    adjustments: unescapedAdjustments(adjustments),
    slots: row.slots.some((slot) => isEscapedText(slot.job))
      ? row.slots.map((slot) => ({ ...slot, job: fromStoredText(slot.job) }))
      : row.slots,
    ...(holdsTruncated || adjustmentsTruncated ? { idsTruncated: true } : {}),
    ...(row.period_floor_at === null ? {} : { periodFloorAt: Number(row.period_floor_at) })
  }
}

/** A recall's row as RecalledIds, identifiers as they were before storage. */
export const recalledFromRow = (row: RecallRow): RecalledIds => ({
  holds: unescapedHolds(row.holds),
  adjustments: unescapedAdjustments(row.adjustments)
})
