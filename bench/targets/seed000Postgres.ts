/**
 * Seed 000's design (ADR-21) taken literally: in one READ COMMITTED transaction, check
 * `used + reserved + requested <= limit` (used: the sum of this month's usage events; reserved: the sum
 * of unexpired reservations) and insert a reservation; no lock. The worker deletes the reservation when
 * the job ends and records the usage event. It has no incremental consumption (consume sends nothing).
 * The ADR also inserts the River job in the same transaction; the bench leaves that out.
 *
 * Two concurrent checks both see the same room and both insert: this is the baseline whose over-grants
 * the report shows.
 */
import type pg from "pg"
import type { HoldRef, MeterName, StepOutcome, Target } from "./Target.js"
import { makeErrorNote, meterLimits } from "./Target.js"
import { baselinePoolSize, makePool } from "./pgCommon.js"

const schema = "bench_seed000"

const schemaSql = `
drop schema if exists ${schema} cascade;
create schema ${schema};
create table ${schema}.usage_events (
  id bigserial primary key,
  user_id text not null,
  event_type text not null,
  amount bigint not null,
  created_at timestamptz not null default now()
);
create index usage_events_period on ${schema}.usage_events (user_id, event_type, created_at);
create table ${schema}.quota_reservations (
  id uuid primary key default gen_random_uuid(),
  user_id text not null,
  event_type text not null,
  reserved_amount bigint not null,
  job_id text not null unique,
  expires_at timestamptz not null
);
create index quota_reservations_active on ${schema}.quota_reservations (user_id, event_type, expires_at);
`

const checkSql = `
select
  (select coalesce(sum(amount), 0) from ${schema}.usage_events
    where user_id = $1 and event_type = $2 and created_at >= date_trunc('month', now()))::bigint
  + (select coalesce(sum(reserved_amount), 0) from ${schema}.quota_reservations
    where user_id = $1 and event_type = $2 and expires_at > now())::bigint as total`

const insertReservationSql = `
insert into ${schema}.quota_reservations (user_id, event_type, reserved_amount, job_id, expires_at)
values ($1, $2, $3, $4, now() + interval '1 hour')`

const deleteReservationSql = `delete from ${schema}.quota_reservations where job_id = $1`
const insertUsageSql = `insert into ${schema}.usage_events (user_id, event_type, amount) values ($1, $2, $3)`

export const makeSeed000Target = async (connectionString: string): Promise<Target> => {
  const pool = makePool(connectionString, baselinePoolSize)
  await pool.query(schemaSql)
  const errors = makeErrorNote()
  let requests = 0

  /** One transaction on one connection; `body` returns the step's outcome. Rolls back on error. */
  const transaction = async (body: (client: pg.PoolClient) => Promise<StepOutcome>): Promise<StepOutcome> => {
    requests += 1
    let client: pg.PoolClient | undefined
    try {
      client = await pool.connect()
      await client.query("begin isolation level read committed")
      const outcome = await body(client)
      await client.query("commit")
      client.release()
      return outcome
    } catch (error) {
      errors.note(error)
      if (client !== undefined) {
        await client.query("rollback").catch(() => undefined)
        client.release()
      }
      return "error"
    }
  }

  /** The worker's end of a job: delete the reservation, record what was used. */
  const finish = (hold: HoldRef, used: number) =>
    transaction(async (client) => {
      await client.query(deleteReservationSql, [hold.id])
      if (used > 0) await client.query(insertUsageSql, [hold.user, hold.meter, used])
      return "ok"
    })

  return {
    key: "seed000",
    label: "seed 000: check then insert, no lock",
    durable: true,
    supportsSlots: false,
    notes: [
      `BEGIN; check; INSERT; COMMIT on one of ${baselinePoolSize} pooled connections (4 round trips); READ COMMITTED, no lock: over-grants expected under concurrency.`
    ],
    prime: async (_users: ReadonlyArray<string>, _meter: MeterName) => {},
    reserve: (hold) =>
      transaction(async (client) => {
        const checked = await client.query<{ total: string }>(checkSql, [hold.user, hold.meter])
        const total = Number(checked.rows[0]?.total ?? 0)
        if (total + hold.amount > meterLimits[hold.meter]) return "refused"
        await client.query(insertReservationSql, [hold.user, hold.meter, hold.amount, hold.id])
        return "ok"
      }),
    consume: async () => "none",
    commit: (hold, actual) => finish(hold, actual),
    release: (hold) => finish(hold, hold.consumed),
    acquireSlot: async () => "none",
    releaseSlot: async () => "none",
    counters: () => ({ requests, messages: requests }),
    takeError: errors.take,
    // The bench drops its whole database afterwards.
    close: () => pool.end()
  }
}
