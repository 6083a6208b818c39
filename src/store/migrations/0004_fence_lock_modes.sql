-- Lock modes that cannot deadlock (see docs/SCALING.md "Why two owners never both grant"):
--   a write's fence check takes FOR KEY SHARE on its partitions' owner rows, in partition order;
--   a lease renewal is a plain UPDATE of lease_expires_at (FOR NO KEY UPDATE strength), which does not
--     conflict with KEY SHARE, so renewals and writes never wait for each other;
--   a claim takes FOR UPDATE, in partition order, which waits for every write holding KEY SHARE, so a
--     write of the old epoch commits before the claim or fails its check after it.
create or replace function assert_partition_epochs(held_partitions integer[], held_epochs bigint[], held_owner text)
returns void language plpgsql
set search_path from current
as $$
declare
  lost integer[];
begin
  perform 1 from partition_owners as owner_row
    where owner_row.partition = any(held_partitions)
    order by owner_row.partition
    for key share;
  select coalesce(array_agg(held.partition order by held.partition), '{}') into lost
    from unnest(held_partitions, held_epochs) as held (partition, epoch)
    where not exists (
      select 1 from partition_owners as owner_row
      where owner_row.partition = held.partition and owner_row.epoch = held.epoch
        and owner_row.owner = held_owner
    );
  if cardinality(lost) > 0 then
    raise exception 'partition epoch superseded' using errcode = 'QCF01', detail = array_to_string(lost, ',');
  end if;
end;
$$;
