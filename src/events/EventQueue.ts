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
 * - Memory holds at most eventsQueuedPerPartitionMax events of a partition (and one read of the log
 *   more): past it, appended rows stay only in the log (`behindFrom`), and the publisher reads them
 *   from there once it has sent what it holds (`refilling`, `refilled`). A JetStream outage of hours
 *   costs rows in Postgres, not memory.
 */
import type { StoreEvent } from "../domain/events.js"
import { eventsQueuedPerPartitionMax } from "../domain/limits.js"

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
  /** Events of `rows`. */
  held: number
  /** Rows from this position on may be in the log only (memory was full): read once `rows` is sent. */
  behindFrom: number | undefined
  /** A read of the log from this position is running: nothing from it on counts as published yet. */
  readingFrom: number | undefined
  /**
   * The lowest append that failed while a read of the log ran (the recovery's or a refill's): that read
   * may have missed its row, so the log is read again from it once the read is merged.
   */
  failedFrom: number | undefined
}

export class EventQueue {
  private readonly pending = new Map<number, number>()
  private readonly lanes = new Map<number, Lane>()
  /** Told when rows are queued for these partitions (their publishers wake). */
  private onQueued: (partitions: Iterable<number>) => void = () => {}

  constructor(
    /** QUOTA_EVENTS_OUTBOX_MAX. */
    readonly perPartitionMax: number,
    /** Events of a partition held in memory (eventsQueuedPerPartitionMax; tests lower it). */
    readonly heldPerPartitionMax: number = eventsQueuedPerPartitionMax
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

  /**
   * A confirmed append's events; kept only while the partition's publisher runs here (else it reads the
   * log), and only while memory has room (else it is read from the log later).
   */
  appended(partition: number, row: QueuedRow): void {
    const lane = this.lanes.get(partition)
    if (lane === undefined || row.events.length === 0 || lane.behindFrom !== undefined) return
    const last = lane.rows[lane.rows.length - 1]
    if (last !== undefined && last.position >= row.position) return
    if (last !== undefined && lane.held + row.events.length > this.heldPerPartitionMax) {
      lane.behindFrom = row.position
      return
    }
    lane.rows.push(row)
    lane.held += row.events.length
    this.onQueued([partition])
  }

  /**
   * An append failed: its outcome was unknown (a COMMIT with no answer), so its row may be in the log,
   * settled as committed, with events never queued here. Nothing from it on counts as published until
   * the publisher has read the log from it (after the store settled the doubt: its reads wait for that).
   */
  appendFailed(partition: number, position: number): void {
    const lane = this.lanes.get(partition)
    if (lane === undefined) return
    if (lane.recovering || lane.readingFrom !== undefined)
      lane.failedFrom = Math.min(lane.failedFrom ?? Infinity, position)
    else this.readFromLog(lane, position)
    this.onQueued([partition])
  }

  /** Rows from `position` on are read from the log (memory forgets what it holds of them). */
  private readFromLog(lane: Lane, position: number): void {
    lane.behindFrom = Math.min(lane.behindFrom ?? Infinity, position)
    this.dropFrom(lane, lane.behindFrom)
  }

  /**
   * Every row at or below the returned position is wholly in the stream, as far as this process knows;
   * undefined when it knows nothing yet (no publisher here, or one still reading the log). `lastFinal`:
   * the actor's last append whose outcome is final: with nothing queued or left in the log, every row up
   * to it is done.
   */
  publishedThrough(partition: number, lastFinal: number): number | undefined {
    const lane = this.lanes.get(partition)
    if (lane === undefined) return undefined
    if (lane.recovering) return lane.persisted
    const notYet = Math.min(
      lane.rows[0]?.position ?? Infinity,
      lane.behindFrom ?? Infinity,
      lane.readingFrom ?? Infinity,
      lane.failedFrom ?? Infinity
    )
    return notYet === Infinity ? lastFinal : notYet - 1
  }

  // ---------------------------------------------------------------------------------------------
  // The publisher's side

  /** A publisher starts for the partition: it reads the log before anything counts as published. */
  open(partition: number): void {
    this.lanes.set(partition, {
      rows: [],
      recovering: true,
      persisted: 0,
      held: 0,
      behindFrom: undefined,
      readingFrom: undefined,
      failedFrom: undefined
    })
  }

  /**
   * The publisher read the log at its start: `rows` (unpublished, in order; `complete`: the log has none
   * after them) go before what was appended meanwhile; `waiting`: the events the log holds unpublished.
   */
  recovered(
    partition: number,
    persisted: number,
    rows: ReadonlyArray<QueuedRow>,
    complete: boolean,
    waiting: number
  ): void {
    const lane = this.lanes.get(partition)
    if (lane === undefined) return
    this.merge(lane, rows, complete)
    lane.persisted = persisted
    lane.recovering = false
    this.pending.set(partition, Math.max(waiting, lane.held))
  }

  /** Where the log must be read from next (memory was full), or undefined when memory holds it all. */
  behind(partition: number): number | undefined {
    return this.lanes.get(partition)?.behindFrom
  }

  /** The publisher reads the log from where memory was full: appends are kept in memory again meanwhile. */
  refilling(partition: number): number | undefined {
    const lane = this.lanes.get(partition)
    if (lane?.behindFrom === undefined) return undefined
    lane.readingFrom = lane.behindFrom
    lane.behindFrom = undefined
    return lane.readingFrom
  }

  /** The read from `refilling`'s position: `rows` (`complete`: none after them), or a failure (undefined). */
  refilled(partition: number, rows: ReadonlyArray<QueuedRow> | undefined, complete: boolean): void {
    const lane = this.lanes.get(partition)
    if (lane?.readingFrom === undefined) return
    const from = lane.readingFrom
    lane.readingFrom = undefined
    if (rows === undefined) {
      // Read again later, from the same place: what memory took meanwhile is read again with it.
      this.readFromLog(lane, Math.min(from, lane.failedFrom ?? Infinity))
      lane.failedFrom = undefined
      return
    }
    this.merge(lane, rows, complete)
  }

  /**
   * `rows` read from the log join what memory holds, in log order, once each. Read incompletely, what
   * comes after the last row read is left to the next read; read to the end, the next read starts
   * after it only if memory was full meanwhile.
   */
  private merge(lane: Lane, rows: ReadonlyArray<QueuedRow>, complete: boolean): void {
    const read = new Set(rows.map((row) => row.position))
    const kept = lane.rows.splice(0).filter((row) => !read.has(row.position))
    lane.rows.push(...rows, ...kept)
    lane.rows.sort((left, right) => left.position - right.position)
    const lastRead = rows[rows.length - 1]?.position
    if (!complete && lastRead !== undefined) lane.behindFrom = lastRead + 1
    else if (lane.behindFrom !== undefined && lastRead !== undefined)
      lane.behindFrom = Math.max(lane.behindFrom, lastRead + 1)
    if (lane.behindFrom !== undefined) this.dropFrom(lane, lane.behindFrom)
    lane.held = 0
    for (const row of lane.rows) lane.held += row.events.length
    if (lane.failedFrom !== undefined) {
      this.readFromLog(lane, lane.failedFrom)
      lane.failedFrom = undefined
    }
  }

  /** Forgets the rows from `position` on (they are read from the log again). */
  private dropFrom(lane: Lane, position: number): void {
    const at = lane.rows.findIndex((row) => row.position >= position)
    if (at < 0) return
    for (const row of lane.rows.splice(at)) lane.held -= row.events.length
  }

  rows(partition: number): ReadonlyArray<QueuedRow> {
    return this.lanes.get(partition)?.rows ?? []
  }

  /** The first `count` rows are wholly in the stream, `events` of their events published now. */
  published(partition: number, count: number, events: number): void {
    const lane = this.lanes.get(partition)
    if (lane !== undefined) {
      lane.rows.splice(0, count)
      lane.held = Math.max(0, lane.held - events)
    }
    this.pending.set(partition, Math.max(0, (this.pending.get(partition) ?? 0) - events))
  }

  /** The partition's publisher stopped here. */
  close(partition: number): void {
    this.lanes.delete(partition)
    this.pending.delete(partition)
  }

  /** Every publisher here has read its log and has nothing left to publish. */
  idle(): boolean {
    for (const lane of this.lanes.values())
      if (
        lane.recovering ||
        lane.rows.length > 0 ||
        lane.behindFrom !== undefined ||
        lane.readingFrom !== undefined
      )
        return false
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
