/**
 * What the events publisher reads of the store: a partition's log rows whose events are not yet known
 * to be in the stream (src/store/postgres/partitionLog.ts). The log is the outbox: a row is deleted only
 * once it is both checkpointed and published.
 */
import { Context } from "effect"
import type { Effect } from "effect"
import type { StoreUnavailable } from "../store/Store.js"
import type { QueuedRow } from "./EventQueue.js"

export interface UnpublishedRows {
  /** What the partition's progress row says is published: every row at or below it. */
  readonly published: number
  /** Rows holding events after `after` (or after `published`), oldest first. */
  readonly rows: ReadonlyArray<QueuedRow>
  /** Read after the published mark (no `after`): every event of the rows after it, read or not. */
  readonly waiting: number
}

export interface EventLogShape {
  /** The rows of `partition` with events after `after` (undefined: after its published mark), at most `limit`. */
  readonly unpublished: (
    partition: number,
    after: number | undefined,
    limit: number
  ) => Effect.Effect<UnpublishedRows, StoreUnavailable>
  /**
   * Distinguishes this database's event ids from another's (its settings' creation time): a database
   * made anew behind the same stream must not have its first events taken for duplicates.
   */
  readonly databaseTag: string
}

export class EventLog extends Context.Service<EventLog, EventLogShape>()("quota-coordinator/EventLog") {}
