-- The fence check as one statement that fails the transaction, so a write group can be pipelined
-- (BEGIN, fence, writes, COMMIT sent at once): a superseded epoch aborts everything after it.
create function assert_partition_epochs(held_partitions integer[], held_epochs bigint[], held_owner text)
returns void language plpgsql
set search_path from current
as $$
declare
  lost integer[];
begin
  -- FOR SHARE keeps the owner rows until COMMIT: a claim (UPDATE) waits for this transaction.
  perform 1 from partition_owners as owner_row
    where owner_row.partition = any(held_partitions)
    for share;
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
