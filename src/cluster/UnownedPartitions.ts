/**
 * Partitions that no process holds, as seen by this process's ownership rounds: every user hashed to
 * such a partition gets no answer, so one that stays unowned for more than a lease (a round of the
 * short members should have claimed it) is reported: a log line when it crosses the lease, the
 * `quota_partitions_unowned` gauge and the /readyz body of every process. Each round asks the database
 * once (ownership.ts `surveyPartitions`); the time is this process's monotonic clock, from the first
 * round that found the partition unowned.
 */

export interface UnownedPartitions {
  /** partition -> performance.now() of the first round that found it unowned, in a run of such rounds. */
  readonly since: Map<number, number>
  /** Those of `since` already reported as unowned for longer than the lease (once per run). */
  readonly reported: Set<number>
}

export const makeUnownedPartitions = (): UnownedPartitions => ({ since: new Map(), reported: new Set() })

/**
 * Records a round's survey: partitions unowned now keep (or start) their time, the rest are forgotten.
 * Returns those unowned for longer than `forMs` that were not reported yet (now they are).
 */
export const recordUnowned = (
  tracked: UnownedPartitions,
  unowned: ReadonlyArray<number>,
  forMs: number,
  nowMs: number
): Array<number> => {
  const current = new Set(unowned)
  for (const partition of tracked.since.keys())
    if (!current.has(partition)) {
      tracked.since.delete(partition)
      tracked.reported.delete(partition)
    }
  for (const partition of current) if (!tracked.since.has(partition)) tracked.since.set(partition, nowMs)
  const newlyOver = unownedLongerThan(tracked, forMs, nowMs).filter(
    (partition) => !tracked.reported.has(partition)
  )
  for (const partition of newlyOver) tracked.reported.add(partition)
  return newlyOver
}

/** The partitions unowned for longer than `forMs` by now, in order. */
export const unownedLongerThan = (tracked: UnownedPartitions, forMs: number, nowMs: number): Array<number> =>
  [...tracked.since]
    .filter(([, firstSeenMs]) => nowMs - firstSeenMs > forMs)
    .map(([partition]) => partition)
    .sort((left, right) => left - right)
