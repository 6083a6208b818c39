/**
 * Says what the deployment risks (docs/SCALING.md): at start, and again whenever it changes, logs the
 * primary's synchronous standbys, warning when an acknowledged grant would not survive the primary's
 * loss; between reads the count is what quota_postgres_synchronous_standbys reports. One read every
 * replicationCheckIntervalMs, on the ownership pool, never per request.
 */
import { Duration, Effect } from "effect"
import type { Scope } from "effect"
import type pg from "pg"
import { replicationCheckIntervalMs } from "../domain/limits.js"
import type { Replication } from "../store/postgres/replication.js"
import { readReplication, survivesPrimaryLoss } from "../store/postgres/replication.js"
import type { Logger } from "../transport/log.js"

/** What the log says of a replication, and whether that is a warning; equal texts are one state. */
const describe = (replication: Replication): { readonly text: string; readonly risky: boolean } => {
  const risky = !survivesPrimaryLoss(replication)
  const standbys =
    replication.standbys.length === 0
      ? "no standby"
      : replication.standbys.map((each) => `${each.name} (${each.syncState})`).join(", ")
  const text = `the primary's standbys: ${standbys}; synchronous_standby_names '${replication.synchronousStandbyNames}', synchronous_commit ${replication.synchronousCommit}`
  return {
    text: risky
      ? `${text}: no synchronous standby waited for, an acknowledged grant may be lost if the primary is lost`
      : `${text}: an acknowledged grant survives the primary's loss`,
    risky
  }
}

/** Reads and logs now, then every replicationCheckIntervalMs for the life of the scope; the count's getter. */
export const watchReplication = (
  pool: pg.Pool,
  logger: Logger
): Effect.Effect<() => number, never, Scope.Scope> =>
  Effect.gen(function* () {
    let synchronousStandbys = 0
    let said: string | undefined
    const check = Effect.tryPromise(() => readReplication(pool)).pipe(
      Effect.match({
        // Unreadable (Postgres away, a standby refused): readiness says so; the count stays as last read.
        onFailure: () => undefined,
        onSuccess: (replication) => {
          synchronousStandbys = replication.synchronousStandbys
          const { text, risky } = describe(replication)
          if (text === said) return
          said = text
          const fields = {
            synchronousStandbys: replication.synchronousStandbys,
            synchronousCommit: replication.synchronousCommit
          }
          if (risky) logger.warn(fields, text)
          else logger.info(fields, text)
        }
      })
    )
    yield* check
    yield* Effect.forkScoped(
      Effect.forever(Effect.andThen(Effect.sleep(Duration.millis(replicationCheckIntervalMs)), check))
    )
    return () => synchronousStandbys
  })
