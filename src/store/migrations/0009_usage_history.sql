-- Usage for billing (PROTOCOL.md revision 1.3).
--
-- usage_recorded: every change of `used` is an event, recorded in the outbox with the change.
alter table events_outbox drop constraint events_outbox_kind_check;
alter table events_outbox add constraint events_outbox_kind_check
  check (kind in ('usage_threshold', 'hold_expired', 'slot_expired', 'plan_changed', 'limit_changed',
                  'usage_recorded'));

-- The UTF-8 bytes of the identifier a stored text was made from (src/store/postgres/storedText.ts):
-- the text itself, or, behind the U+FFFF marker, the text with `\\` -> `\` and `\0` -> U+0000 undone.
-- `list_usage` orders users by these bytes (PROTOCOL.md), which for an escaped identifier differ from
-- its stored text's. Only escaped texts (almost none) take the loop.
-- One plpgsql function with no call to another: an index expression is evaluated with whatever
-- search_path the writing session has, so it must not look a name up.
create function identifier_bytes(stored text) returns bytea
  language plpgsql immutable strict parallel safe as $$
declare
  bytes bytea := '';
  position integer := 2;
  length integer;
  character text;
begin
  if left(stored, 1) <> U&'\FFFF' then
    return convert_to(stored, 'UTF8');
  end if;
  length := char_length(stored);
  while position <= length loop
    character := substr(stored, position, 1);
    if character = '\' and position < length then
      position := position + 1;
      character := substr(stored, position, 1);
      bytes := bytes || case when character = '0' then '\x00'::bytea else convert_to(character, 'UTF8') end;
    else
      bytes := bytes || convert_to(character, 'UTF8');
    end if;
    position := position + 1;
  end loop;
  return bytes;
end
$$;

-- fnv1a32 of bytes (src/domain/partition.ts), to give the rows written before this migration their
-- partition once.
create function fnv1a32(bytes bytea) returns bigint
  language plpgsql immutable strict parallel safe as $$
declare
  hash bigint := 2166136261;
  index integer;
begin
  for index in 0 .. length(bytes) - 1 loop
    hash := ((hash # get_byte(bytes, index)) * 16777619) % 4294967296;
  end loop;
  return hash;
end
$$;

-- list_usage reads one partition's users of one meter and period, in UTF-8 byte order, a page at a
-- time. Written with every usage row from now on; rows written before get theirs here. Null only in a
-- database that never had settings (no coordinator served it), which lists none of them.
alter table usage_totals add column partition integer check (partition >= 0);
update usage_totals
  set partition = fnv1a32(identifier_bytes(user_id)) % (select partitions from settings)
  where exists (select from settings);
-- Rows are inserted once per user, meter and period; the updates of `used` change no indexed column.
create index usage_totals_partition_listing
  on usage_totals (meter, period_start, partition, identifier_bytes(user_id));
