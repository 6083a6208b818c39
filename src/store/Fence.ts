/**
 * Fencing: which partitions this process may write, and under which owner epoch. Every write batch
 * checks, in its own transaction, that the epochs it was granted are still current; a process that
 * was superseded (paused past its lease, partitioned away) fails its writes instead of granting.
 */

/** A partition and the epoch a write was fenced with. */
export interface FencedEpoch {
  readonly partition: number
  readonly epoch: number
}

export interface Fence {
  /** This process's owner id in partition_owners. */
  readonly owner: string
  /** The epoch under which this process owns `partition`, or undefined when it does not own it. */
  readonly epochOf: (partition: number) => number | undefined
  /**
   * Told when a write found partitions owned by someone else, with the epochs that write was fenced
   * with: the process steps down from each it still holds under that epoch. One it has since stepped
   * down from and claimed again under a newer epoch is kept: the stale write says nothing of the new one.
   */
  readonly superseded: (lost: ReadonlyArray<FencedEpoch>) => void
}

/** A write touched partitions this process does not (or no longer) own. */
export class PartitionsFenced extends Error {
  override readonly name = "PartitionsFenced"
  constructor(readonly partitions: ReadonlyArray<number>) {
    super(`partitions ${partitions.join(", ")} are owned by another process (epoch superseded)`)
  }
}

/**
 * A server process, known so that it cannot be mistaken for a later one: a pid alone is reused, by a
 * later session of the same server or by any session after a restart. Times are integer microseconds
 * (text: exact, compared as the server computed them).
 */
export interface BackendIdentity {
  readonly pid: number
  /** When the process started (`pg_stat_activity.backend_start`). */
  readonly startedUs: string
  /** When its server started (`pg_postmaster_start_time()`): another value means another server run. */
  readonly serverStartedUs: string
}

/**
 * A group's transaction was sent, COMMIT included, and no answer says how it ended (the client's query
 * timeout destroyed the connection, or the connection was lost): the server may still commit it.
 * `backend` is the server process that ran it, so the store can make its outcome final before anyone
 * reads the rows it touched.
 */
export class WriteOutcomeUnknown extends Error {
  override readonly name = "WriteOutcomeUnknown"
  constructor(
    readonly backend: BackendIdentity,
    override readonly cause: unknown
  ) {
    super(
      `the outcome of a commit is unknown (backend ${backend.pid}): ${cause instanceof Error ? cause.message : String(cause)}`
    )
  }
}

/**
 * A group's COMMIT was answered with Postgres's warning that its wait for the synchronous standby was
 * cancelled (pg_cancel_backend of its backend, by an operator or a tool): committed on the primary,
 * and visible there, but perhaps not on the standby. Not acknowledged: its callers answer
 * `unavailable`, and nothing is read before the standby has it (outcomeDoubts.ts).
 */
export class CommitNotReplicated extends Error {
  override readonly name = "CommitNotReplicated"
  constructor(readonly warning: string) {
    super(`a commit's wait for the synchronous standby was cancelled: ${warning}`)
  }
}
