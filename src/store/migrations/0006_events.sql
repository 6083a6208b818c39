-- Events (PROTOCOL.md "Events", protocol revision 1.1).
--
-- The outbox: every event is inserted by the write group of the change it reports, in the same
-- transaction, so an acknowledged change always has its event and an unacknowledged one never does.
-- The partition's owner publishes the rows to JetStream in `seq` order (one user's writes are never
-- in flight together, so a user's events are in the order of its decisions) and deletes them once
-- the stream acknowledged them. The event id sent as Nats-Msg-Id is made from `seq` and this
-- database's settings.created_at, so a re-publish after a crash carries the same one.
--
-- body: the event's JSON (kind, time and its own fields); text, not jsonb, because identifiers may
-- hold U+0000, which jsonb refuses and JSON text escapes.
create table events_outbox (
  seq bigserial primary key,
  partition integer not null check (partition >= 0),
  user_id text not null,
  kind text not null
    check (kind in ('usage_threshold', 'hold_expired', 'slot_expired', 'plan_changed', 'limit_changed')),
  at bigint not null,
  body text not null
);
-- The publisher of a partition reads its oldest rows.
create index events_outbox_partition_seq on events_outbox (partition, seq);

-- Usage thresholds already announced in a period (each is announced once per user, meter, period).
alter table usage_totals add column thresholds_crossed double precision[] not null default '{}';
