-- quota-coordinator schema, version 1.
-- Applied by src/store/postgres/migrate.ts inside one transaction with search_path set to the
-- configured schema, so every name here is unqualified.
--
-- Units: amounts and times are bigint (times in ms since the Unix epoch); every value fits in a
-- JS number (<= 2^53-1) and the store maps them back to numbers.
--
-- period_start: the domain's null (a meter with period `none`) is stored as the sentinel -1, so
-- (user_id, meter, period_start) can be a plain primary key and a plain ON CONFLICT target.
-- Real period starts are UTC day or month starts after 1970, so never negative.

-- One row: what this database was created for. A coordinator with another partition count (or
-- prefix) refuses to start on it, because every stored `partition` column would be wrong.
create table settings (
  singleton boolean primary key default true check (singleton),
  prefix text not null,
  partitions integer not null check (partitions > 0),
  created_at bigint not null
);

create table user_plans (
  user_id text primary key,
  plan text not null
);

-- Per-user overrides of a meter's plan limit (set_limit). No row: the plan's default applies.
create table user_limits (
  user_id text not null,
  meter text not null,
  limit_value bigint not null check (limit_value >= 0),
  primary key (user_id, meter)
);

create table holds (
  user_id text not null,
  id text not null,
  meter text not null,
  amount bigint not null check (amount >= 0),
  consumed bigint not null check (consumed >= 0),
  state text not null check (state in ('pending', 'committed', 'released', 'expired')),
  expires_at bigint not null,
  created_at bigint not null,
  closed_at bigint,
  partition integer not null check (partition >= 0),
  primary key (user_id, id),
  -- A hold leaves `pending` exactly when it gets a closed_at.
  check ((state = 'pending') = (closed_at is null))
);
-- The expiry sweep: pending holds by due time.
create index holds_pending_expires_at on holds (expires_at) where state = 'pending';
-- Loading a user: closed holds within the retention window.
create index holds_user_closed_at on holds (user_id, closed_at);

-- Append-only: every change of `used`. Nothing is applied twice: the unique index below rejects a
-- second row for the same (user, operation, hold, key) within one retention bucket, and the whole
-- commit with it.
--
-- Why the bucket (at / 604800000, i.e. 7-day buckets = idRetentionMs): the protocol lets a closed
-- hold's id, its consume keys and an adjust id be forgotten after the 7-day retry window, and the
-- decisions then treat a reuse as new. Such a reuse happens more than 7 days after the first
-- application, so always in a later bucket; a key unique forever would refuse it, and every retry
-- of it, for good. The bucket must never exceed idRetentionMs (test/store/migrate.test.ts checks).
create table usage_ledger (
  user_id text not null,
  meter text not null,
  period_start bigint not null check (period_start = -1 or period_start >= 0),
  operation text not null check (operation in ('consume', 'commit', 'adjust')),
  hold_id text,
  key text not null,
  requested bigint not null,
  delta bigint not null,
  at bigint not null
);
create unique index usage_ledger_applied_once
  on usage_ledger (user_id, operation, coalesce(hold_id, ''), key, (at / 604800000));
-- Loading a user: adjust ids within the retention window.
create index usage_ledger_adjust_at on usage_ledger (user_id, at) where operation = 'adjust';

-- Running totals: used of (user, meter, period) equals the sum of the ledger's deltas for it.
create table usage_totals (
  user_id text not null,
  meter text not null,
  period_start bigint not null check (period_start = -1 or period_start >= 0),
  used bigint not null check (used >= 0),
  primary key (user_id, meter, period_start)
);

create table slots (
  user_id text not null,
  job text not null,
  lease_expires_at bigint not null,
  partition integer not null check (partition >= 0),
  primary key (user_id, job)
);
-- The expiry sweep: leases by end time.
create index slots_lease_expires_at on slots (lease_expires_at);

-- Fencing of partition ownership (used later): a write checks its epoch in the same transaction.
create table partition_owners (
  partition integer primary key check (partition >= 0),
  owner text not null,
  epoch bigint not null,
  lease_expires_at bigint not null
);
