-- Scaling out: the processes sharing the partitions, and per-partition indexes for the orphan sweep.

-- One row per coordinator process; a process whose heartbeat is older than the lease is gone.
create table members (
  owner text primary key,
  heartbeat_at bigint not null,
  -- Set on a graceful leave so the others rebalance at once instead of waiting for the lease.
  leaving boolean not null default false
);

create index holds_partition_pending_expires_at on holds (partition, expires_at) where state = 'pending';
create index slots_partition_lease_expires_at on slots (partition, lease_expires_at);
