/**
 * What the deployment risks: with `synchronous_commit` on (or remote_write, remote_apply) and a
 * synchronous standby, an acknowledged grant is on two servers and survives the primary's loss; with
 * none (or an asynchronous standby, or `synchronous_commit` local or off) the last moments of
 * acknowledged changes can vanish at a failover. Read from the primary, for the log and the
 * quota_postgres_synchronous_standbys gauge. pg_stat_replication shows sync_state only to a superuser
 * or a member of pg_read_all_stats; without, the count reads 0.
 */
import pg from "pg"
import type { BackendIdentity } from "../Fence.js"
import { WriteOutcomeUnknown } from "../Fence.js"
import { withCheckedOutClient } from "./checkedOutClient.js"

export interface Replication {
  /** The standbys the primary streams to, by application_name, with their sync_state. */
  readonly standbys: ReadonlyArray<{ readonly name: string; readonly syncState: string }>
  /** Those whose commits wait for them: sync_state `sync` or `quorum`. */
  readonly synchronousStandbys: number
  readonly synchronousStandbyNames: string
  readonly synchronousCommit: string
}

/** The synchronous_commit values under which a commit waits for the synchronous standbys. */
const waitingCommitModes: ReadonlySet<string> = new Set(["on", "remote_write", "remote_apply"])

/** Whether an acknowledged commit survives the primary's loss: a synchronous standby waited for. */
export const survivesPrimaryLoss = (replication: Replication): boolean =>
  replication.synchronousStandbys > 0 && waitingCommitModes.has(replication.synchronousCommit)

export const readReplication = async (pool: pg.Pool): Promise<Replication> => {
  const [standbys, settings] = await Promise.all([
    pool.query<{ name: string | null; sync_state: string | null }>(
      "select application_name as name, sync_state from pg_stat_replication order by application_name"
    ),
    pool.query<{ names: string; commit: string }>(
      "select current_setting('synchronous_standby_names') as names, current_setting('synchronous_commit') as commit"
    )
  ])
  const listed = standbys.rows.map((row) => ({
    name: row.name ?? "",
    syncState: row.sync_state ?? "unknown"
  }))
  return {
    standbys: listed,
    synchronousStandbys: listed.filter((each) => each.syncState === "sync" || each.syncState === "quorum")
      .length,
    synchronousStandbyNames: settings.rows[0]?.names ?? "",
    synchronousCommit: settings.rows[0]?.commit ?? ""
  }
}

/**
 * The replication barrier: one commit that waits for the synchronous standbys as the server's
 * `synchronous_commit` says. A setval of the barrier sequence (migration 0011) takes a transaction id
 * and writes WAL, so its COMMIT waits (a transaction id alone writes no WAL and would not). WAL is
 * ordered: once it returns, every commit before it is replicated as well, among them those whose
 * backends the outcome doubts' settle ended (outcomeDoubts.ts), which Postgres makes visible on the
 * primary at once, replicated or not. Without a synchronous standby it costs one local commit.
 *
 * No answer (the query timeout while the standby stalls, a lost connection): WriteOutcomeUnknown, so
 * the doubts end its backend, still waiting for the standby, before the next barrier.
 */
export const waitUntilReplicated = (
  pool: pg.Pool,
  schema: string,
  identify: (client: pg.PoolClient) => Promise<BackendIdentity>
): Promise<void> =>
  withCheckedOutClient(
    pool,
    async (client) => {
      const backend = await identify(client)
      try {
        await client.query(`select setval('"${schema}".replication_barrier', 1)`)
      } catch (cause) {
        throw cause instanceof pg.DatabaseError ? cause : new WriteOutcomeUnknown(backend, cause)
      }
    },
    () => true
  )
