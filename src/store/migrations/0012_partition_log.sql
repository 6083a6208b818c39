-- The partition log (issue 36): the write of the request path and the events' outbox.
--
-- A partition actor appends one row per batch it decides: the batch's changes (row images of holds,
-- usage, slots, plans, limits, period floors, ledger entries) and the events they record, in decision
-- order, as JSON text (identifiers may hold U+0000, which jsonb refuses and JSON text escapes). A
-- batch is durable, and may be answered, once its row is committed. `position` is the row's place in
-- its partition's log, handed out by the partition's one writer (fenced by its epoch, as every write);
-- `token` is that writer's claim token, drawn at random when it began to serve the partition: with the
-- partition and the position it makes the ids of the row's events, unique across a promotion of a
-- standby or a restore from a backup, where positions may be handed out again.
--
-- The tables below it (holds, usage_ledger, usage_totals, slots, user_plans, user_limits,
-- period_floors) are the checkpoint: the projection of every row at or below the partition's
-- `checkpointed` position, written off the request path, in large collapsed batches. Loads read the
-- tables: a partition's owner keeps every user whose changes are not yet checkpointed in memory, and
-- a new owner projects the partition's tail before it serves. Rows at or below both `checkpointed` and
-- `published` (every event of the row acknowledged by the stream) are deleted.
create table partition_log (
  partition integer not null check (partition >= 0),
  position bigint not null check (position > 0),
  token text not null,
  events integer not null check (events >= 0),
  body text not null,
  primary key (partition, position)
);

create table partition_progress (
  partition integer primary key check (partition >= 0),
  checkpointed bigint not null default 0,
  published bigint not null default 0
);

-- Room for HOT updates: a checkpoint rewrites `used` of a user's current period in place, with no new
-- index entries (measured: 402 -> about 170 B of WAL per update).
alter table usage_totals set (fillfactor = 70);

-- A ledger key applied twice is refused by the decisions (memory, fenced by the epoch) before a row is
-- appended; a unique index checked only when a checkpoint projects the row would come too late to
-- refuse anything and would stop the partition's checkpoints for good. The checks of the tests count
-- keys applied twice with a query. The consume keys of a hold are found through this index instead.
drop index usage_ledger_applied_once;
create index usage_ledger_consume_keys on usage_ledger (user_id, hold_id) where operation = 'consume';

-- The log is the outbox: events are published from its rows (their ids from the row's token, position
-- and the event's index), so the separate outbox and the incarnation its ids needed go. Events still
-- waiting in it would be lost: the upgrade stops here instead, and the previous version publishes them
-- first (README "Upgrading").
do $$
declare
  waiting bigint;
begin
  select count(*) into waiting from events_outbox;
  if waiting > 0 then
    raise exception 'events_outbox holds % events not yet published; run the previous version until quota_events_pending is 0, then upgrade (README "Upgrading")', waiting;
  end if;
end $$;
drop table events_outbox;
drop function database_incarnation(regclass);
