-- Failover and restore safety (issue 34). (0010 is reserved for another change: see migrate.ts.)
--
-- The database's incarnation: which history of this database a row was written in. An event id was
-- `<database tag>-<seq>`, and `seq` goes back after a promotion (the standby's sequence resumes from
-- the last value it received, Postgres logs sequences 32 values ahead) or a restore (the sequence is
-- restored with the dump): ids already in the stream were handed out again. Every outbox row now
-- records the incarnation it was inserted in, and the id carries it (src/events/Outbox.ts).
--
-- It changes whenever the history may have forked, from what Postgres itself keeps and a dump does
-- not carry: the timeline (a new one at every promotion and at the end of an archive recovery), the
-- server's start (a restart, a copy of the files started elsewhere, a new cluster) and the file node of
-- the table the ids are kept in (a pg_restore --clean or into a new database recreates it; TRUNCATE
-- gives a new one). A 64-bit hash of the three, computed once per insert statement. Not covered: rows
-- restored into the same table of a server that has not restarted since (docs/SCALING.md says what
-- to do).
-- Rows recorded before this migration keep no incarnation (null): their ids stay as published.
alter table events_outbox add column incarnation bigint;

create function database_incarnation(ids_table regclass) returns bigint language sql stable
as $$
  select hashtextextended(
    concat_ws('/',
      -- The timeline: the first 8 hex digits of the current WAL file's name.
      substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8),
      (extract(epoch from pg_postmaster_start_time()) * 1000000)::bigint,
      pg_relation_filenode(ids_table)),
    0)
$$;

-- The replication barrier (src/store/postgres/replication.ts): after the store ends the backend of a
-- commit whose outcome was unknown, that commit is visible on the primary although the synchronous
-- standby may lack it. One setval of this sequence takes a transaction id and writes WAL, so its
-- COMMIT waits for the standby as synchronous_commit says; WAL is ordered, so once it returns the
-- ended commits are replicated too. A sequence, not a row: concurrent barriers never lock each other.
create sequence replication_barrier;
