/**
 * Fencing: which partitions this process may write, and under which owner epoch. Every write batch
 * checks, in its own transaction, that the epochs it was granted are still current; a process that
 * was superseded (paused past its lease, partitioned away) fails its writes instead of granting.
 */

export interface Fence {
  /** This process's owner id in partition_owners. */
  readonly owner: string
  /** The epoch under which this process owns `partition`, or undefined when it does not own it. */
  readonly epochOf: (partition: number) => number | undefined
  /** Told when a write found partitions owned by someone else: the process steps down from them. */
  readonly superseded: (partitions: ReadonlyArray<number>) => void
}

/** A write touched partitions this process does not (or no longer) own. */
export class PartitionsFenced extends Error {
  override readonly name = "PartitionsFenced"
  constructor(readonly partitions: ReadonlyArray<number>) {
    super(`partitions ${partitions.join(", ")} are owned by another process (epoch superseded)`)
  }
}
