/**
 * A COMMIT that outlasts the store's query timeout, as a lost synchronous replica or a storage stall
 * makes one: a deferred trigger (it runs inside COMMIT) on the ledger row of `commit h10` runs `wait`
 * (SQL: a sleep, a lock the test holds). Only the first such commit of each user waits: the sequences
 * are not transactional, so a retry of the same commit does not wait again.
 */
import type pg from "pg"

export const slowFirstCommitOfH10 = async (
  admin: pg.Pool,
  schema: string,
  users: ReadonlyArray<string>,
  wait: string
): Promise<void> => {
  const quoted = `"${schema}"`
  await admin.query(`
    ${users.map((user) => `create sequence ${quoted}."slow_${user}";`).join("\n")}
    create function ${quoted}.sleep_in_commit() returns trigger language plpgsql as $$
    begin
      if nextval(format('%I.%I', '${schema}', 'slow_' || new.user_id)) = 1 then
        perform ${wait};
      end if;
      return null;
    end $$;
    create constraint trigger sleep_in_commit after insert on ${quoted}.usage_ledger
      deferrable initially deferred for each row
      when (new.hold_id = 'h10' and new.operation = 'commit')
      execute function ${quoted}.sleep_in_commit();`)
}
