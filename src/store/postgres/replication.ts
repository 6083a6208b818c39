/**
 * What the deployment risks: with `synchronous_commit` on (or remote_write, remote_apply) and a
 * synchronous standby, an acknowledged grant is on two servers and survives the primary's loss; with
 * none (or an asynchronous standby, or `synchronous_commit` local or off) the last moments of
 * acknowledged changes can vanish at a failover. Read from the primary, for the log and the
 * quota_postgres_synchronous_standbys gauge. pg_stat_replication shows sync_state only to a superuser
 * or a member of pg_read_all_stats; without, the count reads 0.
 */
import type pg from "pg"

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
