import { randomInt } from "node:crypto"
import { Effect } from "effect"
import pg from "pg"
import { migrate } from "../../src/store/postgres/migrate.js"
import { poolConfig } from "../../src/store/postgres/PostgresStore.js"

/**
 * A COMMIT that outlasts the store's query timeout, as a lost synchronous replica or a storage stall
 * makes one: a deferred trigger (it runs inside COMMIT) on the log row that holds the ledger entry of
 * `commit h10` runs `wait` (SQL: a sleep, a lock the test holds). Only the first such commit of each
 * user waits: the sequences are not transactional, so a retry of the same commit does not wait again.
 */
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
    declare
      entry json;
    begin
      for entry in select value from json_array_elements(new.body::json) loop
        if entry->>'kind' = 'ledger' and entry->>'holdId' = 'h10' and entry->>'operation' = 'commit'
           and nextval(format('%I.%I', '${schema}', 'slow_' || (entry->>'user'))) = 1 then
          perform ${wait};
        end if;
      end loop;
      return null;
    end $$;
    create constraint trigger sleep_in_commit after insert on ${quoted}.partition_log
      deferrable initially deferred for each row
      when (new.body like '%"h10"%')
      execute function ${quoted}.sleep_in_commit();`)
}

/**
 * A pipelined store pool with a 1 s query timeout (so the slow COMMIT gets no answer), its sessions
 * named so the test can find them in pg_stat_activity; the schema migrated.
 */
export const slowCommitPool = async (
  connectionString: string,
  schema: string,
  poolMax: number
): Promise<{ readonly pool: pg.Pool; readonly applicationName: string }> => {
  const applicationName = `slow-commit-${process.pid}-${randomInt(1_000_000)}`
  const pool = new pg.Pool({
    ...poolConfig(connectionString, poolMax, true, { queryTimeoutMs: slowCommitQueryTimeoutMs }),
    application_name: applicationName
  })
  pool.on("error", () => {})
  await Effect.runPromise(migrate(pool, schema))
  return { pool, applicationName }
}

export const slowCommitQueryTimeoutMs = 1_000

/** An advisory lock the slow COMMIT waits for (`wait`), held on a client of `admin` until `release`. */
export const heldLock = async (
  admin: pg.Pool
): Promise<{
  readonly wait: string
  readonly release: () => Promise<void>
  readonly end: () => Promise<void>
}> => {
  const key = randomInt(2 ** 31 - 1)
  const holder = await admin.connect()
  await holder.query("select pg_advisory_lock($1)", [key])
  return {
    wait: `pg_advisory_xact_lock_shared(${key})`,
    release: async () => {
      await holder.query("select pg_advisory_unlock($1)", [key])
    },
    end: async () => {
      await holder.query("select pg_advisory_unlock_all()")
      holder.release()
    }
  }
}

/** Polls `condition` every 5 ms for up to 5 s. */
export const until = async (condition: () => Promise<boolean>, what: string): Promise<void> => {
  const deadline = performance.now() + 5_000
  while (!(await condition())) {
    if (performance.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await new Promise((resolve) => setTimeout(resolve, 5))
  }
}
