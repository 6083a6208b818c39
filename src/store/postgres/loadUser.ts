/**
 * Loading users: everything an actor needs, in one statement and one round trip for many users at once
 * (the cold start of a partition touches thousands). Each part is a json_agg subselect; bigint values
 * come back as JSON numbers, exact up to 2^53-1.
 */
import type { HoldRecord, StoredUser } from "../../domain/events.js"
import { fromStoredText, isEscapedText } from "./storedText.js"
import { periodNoneSentinel } from "./writeEvents.js"

/**
 * $1 the users (text[], distinct), $2 the retention cutoff (now - idRetentionMs): one row per user,
 * with `user_id`. Closed holds and adjust ids older than the cutoff are forgotten. Consume keys of a
 * loaded hold come with it (those applied since the hold was created), found through
 * usage_ledger_applied_once.
 */
export const loadUsersSql = (schema: string): string => `
  select wanted.user_id, loaded.*
  from unnest($1::text[]) as wanted (user_id)
  cross join lateral (
    select
      (select plan from "${schema}".user_plans where user_id = wanted.user_id) as plan,
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
        select json_agg(json_build_object(
          'id', hold.id, 'meter', hold.meter, 'amount', hold.amount, 'consumed', hold.consumed,
          'state', hold.state, 'expiresAt', hold.expires_at, 'createdAt', hold.created_at,
          'closedAt', hold.closed_at,
          'consumeKeys', coalesce((
            select json_agg(entry.key)
            from "${schema}".usage_ledger as entry
            where entry.user_id = wanted.user_id and entry.operation = 'consume'
              and coalesce(entry.hold_id, '') = hold.id
              -- Only this incarnation's keys: a hold id reused after retention starts with none.
              and entry.at >= hold.created_at
          ), '[]'::json)))
        from "${schema}".holds as hold
        where hold.user_id = wanted.user_id and (hold.state = 'pending' or hold.closed_at >= $2)
      ), '[]'::json) as holds,
      coalesce((
        select json_agg(json_build_object('id', key, 'meter', meter, 'amount', requested, 'at', at) order by at)
        from "${schema}".usage_ledger
        where user_id = wanted.user_id and operation = 'adjust' and at >= $2
      ), '[]'::json) as adjustments,
      coalesce((
        select json_agg(json_build_object('job', job, 'leaseExpiresAt', lease_expires_at))
        from "${schema}".slots where user_id = wanted.user_id
      ), '[]'::json) as slots
  ) as loaded`

/** A row of loadUsersSql as `pg` parses it (json columns are parsed to values). */
export interface LoadUserRow {
  readonly plan: string | null
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

/**
 * The row as the actor's StoredUser, its identifiers as they were before storage (storedText.ts).
 * Nearly no identifier is escaped, so the row's objects are kept as they are unless one is: a
 * partition's cold start loads thousands of users.
 */
export const storedUserFromRow = (row: LoadUserRow): StoredUser => ({
  plan: row.plan,
  limitOverrides: row.limit_overrides,
  usage: row.usage,
  holds: row.holds.some((hold) => isEscapedText(hold.id) || hold.consumeKeys.some(isEscapedText))
    ? row.holds.map((hold) => ({
        ...hold,
        id: fromStoredText(hold.id),
        consumeKeys: hold.consumeKeys.map(fromStoredText)
      }))
    : row.holds,
  adjustments: row.adjustments.some((adjustment) => isEscapedText(adjustment.id))
    ? row.adjustments.map((adjustment) => ({ ...adjustment, id: fromStoredText(adjustment.id) }))
    : row.adjustments,
  slots: row.slots.some((slot) => isEscapedText(slot.job))
    ? row.slots.map((slot) => ({ ...slot, job: fromStoredText(slot.job) }))
    : row.slots
})
