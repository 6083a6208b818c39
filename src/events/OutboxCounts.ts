/**
 * Events recorded and not yet published, per partition, as this process knows them: the store adds
 * what each commit recorded, a partition's publisher counts its outbox when it starts and takes away
 * what it published. It is what `quota_events_pending` shows and what the outbox's cap is checked
 * against before a write (src/store/postgres/PostgresStore.ts): past the cap by at most the events of
 * the writes already in flight.
 */
export class OutboxCounts {
  private readonly pending = new Map<number, number>()
  /** Told after a commit recorded events of these partitions (their publishers wake). */
  private onRecorded: (partitions: Iterable<number>) => void = () => {}

  constructor(
    /** QUOTA_EVENTS_OUTBOX_MAX. */
    readonly perPartitionMax: number
  ) {}

  /** Who hears of recorded events (the publisher, made after the store that counts them). */
  listen(onRecorded: (partitions: Iterable<number>) => void): void {
    this.onRecorded = onRecorded
  }

  /** A partition whose outbox `recording` would take past the cap, or undefined when all fit. */
  overflowing(recording: ReadonlyMap<number, number>): number | undefined {
    for (const [partition, count] of recording) {
      if ((this.pending.get(partition) ?? 0) + count > this.perPartitionMax) return partition
    }
    return undefined
  }

  recorded(recording: ReadonlyMap<number, number>): void {
    for (const [partition, count] of recording)
      this.pending.set(partition, (this.pending.get(partition) ?? 0) + count)
    this.onRecorded(recording.keys())
  }

  /** A checkpoint moved the partition's events from its log into the outbox: its publisher wakes. */
  checkpointed(partition: number): void {
    this.onRecorded([partition])
  }

  published(partition: number, count: number): void {
    this.pending.set(partition, Math.max(0, (this.pending.get(partition) ?? 0) - count))
  }

  /** What a count of the partition's outbox found. */
  set(partition: number, count: number): void {
    this.pending.set(partition, count)
  }

  /** The partition is no longer this process's: its publisher stopped. */
  forget(partition: number): void {
    this.pending.delete(partition)
  }

  of(partition: number): number {
    return this.pending.get(partition) ?? 0
  }

  total(): number {
    let total = 0
    for (const count of this.pending.values()) total += count
    return total
  }
}
