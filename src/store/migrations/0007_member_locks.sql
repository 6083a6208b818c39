-- A process that died is known at once, not after its lease: every coordinator holds a session-level
-- advisory lock (pg_advisory_lock(namespace, lock_key)) on a connection of its own for as long as it
-- runs, and records the key with its heartbeat. Postgres releases the lock when that connection ends
-- (the process died, or was cut off from the database): a member whose lock is gone is dead, and its
-- partitions may be claimed without waiting out their leases. A paused process still holds its lock;
-- it loses its partitions only when their leases run out, as before, and the epoch fence stops its
-- writes either way.
alter table members add column lock_key integer;
