/**
 * Seed 004's design (the TOCTOU post-mortem): a plpgsql function locks the user's period row
 * `FOR UPDATE`, sums the user's pending holds, and inserts a hold if
 * `limit - used - sum(pending) >= amount`. Commit and release change the hold's status (commit adds
 * the actual usage to `used`), consumption adds to `used` as it happens. One function call per step,
 * each its own transaction (fsync'd at commit), over a pool of `baselinePoolSize` connections.
 *
 * Differences from the seed, all in its favour or neutral: the pending sum subtracts what a hold already
 * consumed (the seed sums the whole estimate, refusing more), and holds live in their own table rather
 * than as a column of the report rows.
 */
import type { HoldRef, MeterName, StepOutcome, Target } from "./Target.js"
import { makeErrorNote, meterLimits } from "./Target.js"
import { baselinePoolSize, makePool } from "./pgCommon.js"

const schema = "bench_seed004"

const schemaSql = `
drop schema if exists ${schema} cascade;
create schema ${schema};
create table ${schema}.periods (
  user_id text not null,
  meter text not null,
  tokens_limit bigint not null,
  tokens_used bigint not null default 0,
  primary key (user_id, meter)
);
create table ${schema}.holds (
  user_id text not null,
  id text not null,
  meter text not null,
  amount bigint not null,
  consumed bigint not null default 0,
  status text not null,
  primary key (user_id, id)
);
create index holds_pending on ${schema}.holds (user_id, meter) where status = 'pending';

create function ${schema}.try_reserve(p_user text, p_meter text, p_id text, p_amount bigint, p_limit bigint)
returns boolean language plpgsql as $$
declare
  v_period ${schema}.periods;
  v_reserved bigint;
begin
  -- Lock the user's period row so concurrent reservations of this user queue here.
  select * into v_period from ${schema}.periods
    where user_id = p_user and meter = p_meter for update;
  if not found then
    insert into ${schema}.periods (user_id, meter, tokens_limit) values (p_user, p_meter, p_limit)
      on conflict do nothing;
    select * into v_period from ${schema}.periods
      where user_id = p_user and meter = p_meter for update;
  end if;
  select coalesce(sum(amount - consumed), 0) into v_reserved from ${schema}.holds
    where user_id = p_user and meter = p_meter and status = 'pending';
  if v_period.tokens_limit - v_period.tokens_used - v_reserved < p_amount then
    return false;
  end if;
  insert into ${schema}.holds (user_id, id, meter, amount, status)
    values (p_user, p_id, p_meter, p_amount, 'pending');
  return true;
end $$;

create function ${schema}.consume(p_user text, p_id text, p_amount bigint)
returns boolean language plpgsql as $$
declare
  v_meter text;
begin
  update ${schema}.holds set consumed = consumed + p_amount
    where user_id = p_user and id = p_id and status = 'pending'
    returning meter into v_meter;
  if not found then return false; end if;
  update ${schema}.periods set tokens_used = tokens_used + p_amount
    where user_id = p_user and meter = v_meter;
  return true;
end $$;

create function ${schema}.commit_hold(p_user text, p_id text, p_actual bigint)
returns boolean language plpgsql as $$
declare
  v_meter text;
  v_consumed bigint;
begin
  update ${schema}.holds set status = 'complete'
    where user_id = p_user and id = p_id and status = 'pending'
    returning meter, consumed into v_meter, v_consumed;
  if not found then return false; end if;
  update ${schema}.periods set tokens_used = tokens_used + (p_actual - v_consumed)
    where user_id = p_user and meter = v_meter;
  return true;
end $$;

create function ${schema}.release_hold(p_user text, p_id text)
returns boolean language plpgsql as $$
begin
  update ${schema}.holds set status = 'released'
    where user_id = p_user and id = p_id and status = 'pending';
  return found;
end $$;
`

export const makeSeed004Target = async (connectionString: string): Promise<Target> => {
  const pool = makePool(connectionString, baselinePoolSize)
  await pool.query(schemaSql)
  const errors = makeErrorNote()
  let requests = 0

  const call = (sql: string, values: Array<unknown>): Promise<StepOutcome> => {
    requests += 1
    return errors.guard(async () => {
      const result = await pool.query<{ ok: boolean }>(sql, values)
      return result.rows[0]?.ok === true ? "ok" : "refused"
    })
  }

  return {
    key: "seed004",
    label: "seed 004: Postgres FOR UPDATE function",
    durable: true,
    supportsSlots: false,
    notes: [
      `plpgsql function per step over a pool of ${baselinePoolSize} connections; each call its own fsync'd transaction; schema \`${schema}\` in the bench's own database.`
    ],
    prime: async (users: ReadonlyArray<string>, meter: MeterName) => {
      if (users.length === 0) return
      await pool.query(
        `insert into ${schema}.periods (user_id, meter, tokens_limit)
         select user_id, $2, $3 from unnest($1::text[]) as user_id on conflict do nothing`,
        [users, meter, meterLimits[meter]]
      )
    },
    reserve: (hold: HoldRef) =>
      call(`select ${schema}.try_reserve($1, $2, $3, $4, $5) as ok`, [
        hold.user,
        hold.meter,
        hold.id,
        hold.amount,
        meterLimits[hold.meter]
      ]),
    consume: (hold, amount) =>
      call(`select ${schema}.consume($1, $2, $3) as ok`, [hold.user, hold.id, amount]),
    commit: (hold, actual) =>
      call(`select ${schema}.commit_hold($1, $2, $3) as ok`, [hold.user, hold.id, actual]),
    release: (hold) => call(`select ${schema}.release_hold($1, $2) as ok`, [hold.user, hold.id]),
    acquireSlot: async () => "none",
    releaseSlot: async () => "none",
    counters: () => ({ requests, messages: requests }),
    takeError: errors.take,
    // The bench drops its whole database afterwards.
    close: () => pool.end()
  }
}
