/**
 * Events recorded and not yet in the stream, per partition, as this process knows them: the partition
 * log is the outbox (src/store/postgres/partitionLog.ts), and this is its publishing side in memory.
 *
 * - The store counts what each append records and refuses an append that would take a partition past
 *   QUOTA_EVENTS_OUTBOX_MAX events waiting (`overflowing`, `recorded`): `quota_events_pending` shows it.
 * - A partition actor hands each confirmed append's events over (`appended`); the partition's publisher
 *   (EventPublisher.ts) takes them in log order and drops a row once the stream acknowledged all of it.
 * - A checkpoint asks how far the log is published (`publishedThrough`): rows at or below both that and
 *   the checkpoint are deleted. What this process has not seen (a previous owner's rows, a publisher
 *   still reading the log when it starts) it never claims as published.
 */
import type { StoreEvent } from "../domain/events.js"

export type PublishedEvent = Extract<StoreEvent, { kind: "event" }>

/** One log row's events to publish, in decision order. */
export interface QueuedRow {
  readonly position: number
  /** The claim token of the actor that appended the row: with the position, its events' ids. */
  readonly token: string
  readonly events: ReadonlyArray<PublishedEvent>
}

/** A partition whose publisher runs here. */
interface Lane {
  /** Rows not yet wholly in the stream, in log order (from the log at start, then from appends). */
  readonly rows: Array<QueuedRow>
  /** Reading the log at start: nothing may be claimed as published beyond `persisted` until it is read. */
  recovering: boolean
  /** What the partition's progress row says is published (every row at or below it). */
  persisted: number
}

export class EventQueue {
  private readonly pending = new Map<number, number>()
  private readonly lanes = new Map<number, Lane>()
  /** Told when rows are queued for these partitions (their publishers wake). */
  private onQueued: (partitions: Iterable<number>) => void = () => {}

  constructor(
    /** QUOTA_EVENTS_OUTBOX_MAX. */
    readonly perPartitionMax: number
  ) {}

  /** Who hears of queued rows (the publisher, made after the store and the coordinator). */
  listen(onQueued: (partitions: Iterable<number>) => void): void {
    this.onQueued = onQueued
  }

  /** A partition whose events `recording` would take past the cap, or undefined when all fit. */
  overflowing(recording: ReadonlyMap<number, number>): number | undefined {
    for (const [partition, count] of recording) {
      if ((this.pending.get(partition) ?? 0) + count > this.perPartitionMax) return partition
    }
    return undefined
  }

  recorded(recording: ReadonlyMap<number, number>): void {
    for (const [partition, count] of recording)
      this.pending.set(partition, (this.pending.get(partition) ?? 0) + count)
  }

  /** A confirmed append's events; kept only while the partition's publisher runs here (else it reads the log). */
  appended(partition: number, row: QueuedRow): void {
    const lane = this.lanes.get(partition)
    if (lane === undefined || row.events.length === 0) return
    const last = lane.rows[lane.rows.length - 1]
    if (last !== undefined && last.position >= row.position) return
    lane.rows.push(row)
    this.onQueued([partition])
  }

  /**
   * Every row at or below the returned position is wholly in the stream, as far as this process knows;
   * undefined when it knows nothing yet (no publisher here, or one still reading the log). `lastFinal`:
   * the actor's last append whose outcome is final: with nothing queued, every row up to it is done.
   */
  publishedThrough(partition: number, lastFinal: number): number | undefined {
    const lane = this.lanes.get(partition)
    if (lane === undefined) return undefined
    if (lane.recovering) return lane.persisted
    const first = lane.rows[0]
    return first === undefined ? lastFinal : first.position - 1
  }

  // ---------------------------------------------------------------------------------------------
  // The publisher's side

  /** A publisher starts for the partition: it reads the log before anything counts as published. */
  open(partition: number): void {
    this.lanes.set(partition, { rows: [], recovering: true, persisted: 0 })
  }

  /** The publisher read the log: `rows` (unpublished, in order) go before what was appended meanwhile. */
  recovered(partition: number, persisted: number, rows: ReadonlyArray<QueuedRow>): void {
    const lane = this.lanes.get(partition)
    if (lane === undefined) return
    const appended = lane.rows.splice(0)
    const read = new Set(rows.map((row) => row.position))
    lane.rows.push(...rows, ...appended.filter((row) => !read.has(row.position)))
    lane.rows.sort((left, right) => left.position - right.position)
    lane.persisted = persisted
    lane.recovering = false
    let events = 0
    for (const row of lane.rows) events += row.events.length
    this.pending.set(partition, events)
  }

  rows(partition: number): ReadonlyArray<QueuedRow> {
    return this.lanes.get(partition)?.rows ?? []
  }

  /** The first `count` rows are wholly in the stream, `events` of their events published now. */
  published(partition: number, count: number, events: number): void {
    this.lanes.get(partition)?.rows.splice(0, count)
    this.pending.set(partition, Math.max(0, (this.pending.get(partition) ?? 0) - events))
  }

  /** The partition's publisher stopped here. */
  close(partition: number): void {
    this.lanes.delete(partition)
    this.pending.delete(partition)
  }

  /** Every publisher here has read its log and has nothing left to publish. */
  idle(): boolean {
    for (const lane of this.lanes.values()) if (lane.recovering || lane.rows.length > 0) return false
    return true
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
