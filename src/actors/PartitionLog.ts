/**
 * A partition actor's view of its partition's log (src/store/postgres/partitionLog.ts): where its next
 * append goes, the appends not yet in the tables, and their checkpoint.
 *
 * The log is the write: each batch is one appended row. The tables are the checkpoint, written off the
 * request path: after `checkpointLogRowsMax` rows, `checkpointIntervalMs` after the oldest row not yet
 * in them, before an admin read of the tables, and before users whose last append failed are loaded
 * again. A user whose changes are not all in the tables (dirty) stays in memory: it is never evicted,
 * so a load always reads a user whose every change the tables hold. A new owner opens the partition
 * by bringing the previous owner's tail into the tables before it serves.
 */
import type { StoreEvent } from "../domain/events.js"
import { checkpointIntervalMs, checkpointLogRowsMax, unprojectedLogRowsMax } from "../domain/limits.js"
import type { WriteTarget } from "../store/Store.js"

/** An append this actor made and holds until it is checkpointed. */
interface Unprojected {
  readonly position: number
  readonly events: ReadonlyArray<StoreEvent>
}

export class PartitionLog {
  /** The epoch the log was opened under (its tail brought in); undefined until then, and after a reset. */
  openedFor: number | undefined = undefined
  /** An open is running. */
  opening = false
  /** Every row at or below it is in the tables, as this actor last learned it. */
  checkpointed = 0
  /** Users may be loaded only once `checkpointed` reaches it: an append of theirs failed, maybe landed. */
  loadsNeed = 0
  /** A checkpoint is running (one at a time). */
  checkpointing = false
  private nextPosition = 1
  private token = ""
  /** Bumped at every open and reset: an append's outcome reported after either is not this log's. */
  private opens = 0
  /** The highest position whose append is final (confirmed or failed): a checkpoint goes that far. */
  private lastFinal = 0
  private readonly unprojected: Array<Unprojected> = []
  /** When the oldest append not in the tables was confirmed (Clock ms; Infinity: none). */
  private oldestUnprojectedAt = Infinity
  /**
   * The published mark this actor's last checkpoint wrote. Rows above it stay in the table: once the
   * publisher is further, a checkpoint with nothing to project moves the mark and trims them.
   */
  private publishedMarked = 0
  /** When to ask again whether the publisher passed the mark (Clock ms; Infinity: not asked). */
  private publishedCheckAt = Infinity

  /** Opened under `epoch`: appends start at `nextPosition`, their events' ids carry `token`. */
  opened(epoch: number, nextPosition: number, token: string, now: number, publishes: boolean): void {
    this.openedFor = epoch
    this.opening = false
    this.opens += 1
    this.nextPosition = nextPosition
    this.lastFinal = nextPosition - 1
    this.checkpointed = Math.max(this.checkpointed, nextPosition - 1)
    this.token = token
    // The previous owner's mark is not known here: a check writes this publisher's (none without events).
    this.publishedMarked = 0
    this.publishedCheckAt = publishes ? now + checkpointIntervalMs : Infinity
  }

  /** Forgets everything but nothing of the rows: the next open brings the tail into the tables. */
  reset(): void {
    this.opens += 1
    this.openedFor = undefined
    this.opening = false
    this.unprojected.length = 0
    this.oldestUnprojectedAt = Infinity
    this.publishedMarked = 0
    this.publishedCheckAt = Infinity
    this.loadsNeed = 0
    this.checkpointed = 0
  }

  /** Where the next batch goes, and which open of the log it belongs to. */
  take(partition: number, epoch: number): { readonly target: WriteTarget; readonly open: number } {
    const position = this.nextPosition
    this.nextPosition += 1
    return { target: { partition, epoch, position, token: this.token }, open: this.opens }
  }

  /**
   * The append at `position` (taken in `open`) is durable: held until checkpointed, or already in the
   * tables (`checkpointed`: a store with no log).
   */
  confirmed(
    position: number,
    events: ReadonlyArray<StoreEvent>,
    now: number,
    open: number,
    checkpointed: boolean
  ): void {
    if (open !== this.opens) return
    this.lastFinal = Math.max(this.lastFinal, position)
    if (checkpointed) {
      this.checkpointed = Math.max(this.checkpointed, position)
      return
    }
    this.unprojected.push({ position, events })
    if (this.oldestUnprojectedAt === Infinity) this.oldestUnprojectedAt = now
  }

  /** The append at `position` failed (its outcome final once the store settles it): users of it reload after a checkpoint through it. */
  failed(position: number, open: number): void {
    if (open !== this.opens) return
    this.lastFinal = Math.max(this.lastFinal, position)
    this.loadsNeed = Math.max(this.loadsNeed, position)
  }

  /** Whether a load must wait for a checkpoint. */
  loadsBlocked(): boolean {
    return this.checkpointed < this.loadsNeed
  }

  /** Appends confirmed and not yet in the tables. */
  unprojectedRows(): number {
    return this.unprojected.length
  }

  /** Too many appends wait for a checkpoint (the store refuses them): no more writes until it catches up. */
  full(): boolean {
    return this.unprojected.length >= unprojectedLogRowsMax
  }

  /** When a checkpoint is due by time (Infinity: nothing to checkpoint). */
  checkpointDueAt(): number {
    return Math.min(
      this.oldestUnprojectedAt === Infinity ? Infinity : this.oldestUnprojectedAt + checkpointIntervalMs,
      this.publishedCheckAt
    )
  }

  /** The last position whose append is final. */
  lastFinalPosition(): number {
    return this.lastFinal
  }

  /**
   * Whether a checkpoint should run only to move the published mark: its check fell due and the
   * publisher (`published`: how far it is; undefined: not known here yet) passed the mark. Not yet
   * passed, the check is put off by an interval.
   */
  publishedMarkDue(now: number, published: number | undefined): boolean {
    if (this.checkpointing || this.openedFor === undefined || now < this.publishedCheckAt) return false
    if (published !== undefined && published > this.publishedMarked) return true
    this.publishedCheckAt = now + checkpointIntervalMs
    return false
  }

  /** Whether a checkpoint should start now (`forced`: something waits for one). */
  checkpointDue(now: number, forced: boolean): boolean {
    if (this.checkpointing || this.openedFor === undefined) return false
    if (forced || this.loadsBlocked()) return this.lastFinal > this.checkpointed
    return this.unprojected.length >= checkpointLogRowsMax || now >= this.checkpointDueAt()
  }

  /** What a checkpoint now covers: the appends held, through the last final position. */
  checkpointPlan(): { readonly known: ReadonlyArray<Unprojected>; readonly through: number } {
    this.checkpointing = true
    return { known: [...this.unprojected], through: this.lastFinal }
  }

  /** The checkpoint reached `checkpointed` and wrote the mark `published`: what it covered leaves memory. */
  checkpointDone(checkpointed: number, published: number | undefined, now: number): void {
    this.checkpointing = false
    if (this.openedFor === undefined) return
    this.checkpointed = Math.max(this.checkpointed, checkpointed)
    if (published !== undefined) this.publishedMarked = Math.max(this.publishedMarked, published)
    this.publishedCheckAt = this.publishedMarked >= this.checkpointed ? Infinity : now + checkpointIntervalMs
    let kept = 0
    while (kept < this.unprojected.length && this.unprojected[kept]!.position <= this.checkpointed) kept += 1
    this.unprojected.splice(0, kept)
    // What is left was confirmed while the checkpoint ran: due a full interval from now.
    this.oldestUnprojectedAt = this.unprojected.length === 0 ? Infinity : now
  }

  checkpointFailed(): void {
    this.checkpointing = false
  }

  /** A user whose last append is not yet in the tables. */
  isDirty(lastPosition: number): boolean {
    return lastPosition > this.checkpointed
  }
}
