/**
 * Commits whose outcome is unknown, made final before the store reads again.
 *
 * A group's COMMIT that outlasts the query timeout (a lost synchronous replica, a storage stall), or
 * whose connection is lost after it was sent, may still commit on the server. The actors of that group
 * answer `unavailable` and load their users again; a load that read before the late commit landed
 * would leave memory behind the database, and the next whole-row write would overwrite what landed
 * (issue 19: 5 010 granted against 5 000). So every load first makes each such transaction final:
 * it ends the server process that ran it (`pg_terminate_backend`) and waits until that process is
 * gone. A transaction still running is then rolled back; one already committed (or committed locally
 * while it waited for a replica) stays committed. Either way the next read sees its final outcome.
 *
 * Until that is done, loads fail with the reason (callers answer `unavailable`) and the next load
 * tries again: a server that cannot be reached answers no reads anyway.
 */
import type pg from "pg"
import { storeOutcomeSettleWaitMs } from "../../domain/limits.js"

export interface OutcomeDoubts {
  /** Records the server process of a commit whose outcome is unknown. */
  readonly add: (backend: number) => void
  /** Whether some commit's outcome is still unknown. */
  readonly pending: () => boolean
  /** Resolves once every recorded commit is final; rejects (keeping the rest) when one cannot be made so. */
  readonly settle: () => Promise<void>
}

const settlePollMs = 20

export const makeOutcomeDoubts = (pool: pg.Pool, enabled: boolean): OutcomeDoubts => {
  const backends = new Set<number>()
  let settling: Promise<void> | undefined

  /** Whether the server process is still there; a statement of its own so it reads a fresh snapshot. */
  const alive = async (backend: number): Promise<boolean> =>
    ((await pool.query("select 1 from pg_stat_activity where pid = $1", [backend])).rowCount ?? 0) > 0

  const end = async (backend: number): Promise<void> => {
    // False (with a warning) when it is already gone: its transaction is final either way.
    await pool.query("select pg_terminate_backend($1)", [backend])
    const deadline = performance.now() + storeOutcomeSettleWaitMs
    while (await alive(backend)) {
      if (performance.now() >= deadline)
        throw new Error(
          `the server process ${backend} of a commit whose outcome is unknown has not ended within ${storeOutcomeSettleWaitMs} ms`
        )
      await new Promise((resolve) => setTimeout(resolve, settlePollMs))
    }
    backends.delete(backend)
  }

  const settleAll = async (): Promise<void> => {
    try {
      for (const backend of [...backends]) await end(backend)
    } finally {
      settling = undefined
    }
  }

  return {
    add: (backend) => {
      if (enabled) backends.add(backend)
    },
    pending: () => backends.size > 0,
    settle: () => (settling ??= settleAll())
  }
}
