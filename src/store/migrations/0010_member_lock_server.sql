-- A member is known dead when the member lock it recorded is held by no session (migration 0007).
-- That says something only on the server where the lock was taken: a restart or a failover ends every
-- session, and on the new server nobody holds any lock until each member has taken its own again. The
-- rule used to wait 5 s after pg_postmaster_start_time(), which a standby promoted in place keeps from
-- its start as a standby, so after a failover every member looked dead to the first to lock again.
-- Now each member records the server its lock was taken on, and only a lock taken on this very server
-- can be found lost here (issue 34, item 3).
alter table members add column lock_server text;

-- This server as the member locks know it: when it started and its timeline. A restart changes the
-- first, a promotion the second (the WAL insert timeline, current at once; pg_control_checkpoint()'s
-- waits for the first checkpoint after the promotion). Microseconds, not text, so that no session's
-- TimeZone or DateStyle changes it. Only asked on a writable server (pg_current_wal_lsn() refuses a
-- standby, which nothing of the coordinator writes to anyway).
create function member_lock_server() returns text language sql volatile
as $$
  select (extract(epoch from pg_postmaster_start_time()) * 1000000)::bigint::text
    || '/' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)
$$;

-- Whether `member` is known dead: it recorded a member lock taken on this server, in namespace
-- `lock_namespace`, and no session holds that lock now. Judged where a claim takes a row (ownership.ts):
-- VOLATILE, so each call reads the members row as committed when it runs (a statement of a volatile
-- function takes a fresh snapshot), not as of the claim's start, and pg_locks as it is then. A member
-- that took its lock again and heartbeat while a claimer's round ran is alive when the claim reaches
-- its rows, whatever that round read earlier.
create function member_lock_lost(member text, lock_namespace bigint) returns boolean
language plpgsql volatile
set search_path from current
as $$
declare
  recorded_key integer;
  recorded_server text;
begin
  select lock_key, lock_server into recorded_key, recorded_server from members where owner = member;
  if recorded_key is null or recorded_server is distinct from member_lock_server() then
    return false;
  end if;
  return not exists (
    select 1 from pg_locks as lock
    where lock.locktype = 'advisory' and lock.granted and lock.objsubid = 2
      and lock.database = (select oid from pg_database where datname = current_database())
      and lock.classid = lock_namespace::oid and lock.objid = recorded_key::oid
  );
end;
$$;
