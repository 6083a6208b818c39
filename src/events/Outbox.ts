/**
 * The outbox port: events recorded with their changes (src/store/postgres/writeEvents.ts), read by the
 * publisher of their partition in order and removed once the stream has them.
 */
import { Context } from "effect"
import type { Effect } from "effect"
import type { QuotaEventKind } from "../domain/events.js"
import type { StoreUnavailable } from "../store/Store.js"

export interface OutboxRow {
  /** Order of recording; with the database's tag, the event's id. */
  readonly seq: number
  readonly user: string
  readonly kind: QuotaEventKind
  /** The event's JSON as decided: `event`, `at` and the kind's fields. */
  readonly body: string
}

export interface OutboxShape {
  /** A partition's oldest rows, at most `limit`, in recording order. */
  readonly read: (
    partition: number,
    limit: number
  ) => Effect.Effect<ReadonlyArray<OutboxRow>, StoreUnavailable>
  /** Removes published rows. */
  readonly remove: (seqs: ReadonlyArray<number>) => Effect.Effect<void, StoreUnavailable>
  /** Rows waiting per partition (only those with rows appear). */
  readonly count: (
    partitions: ReadonlyArray<number>
  ) => Effect.Effect<ReadonlyMap<number, number>, StoreUnavailable>
  /**
   * Distinguishes this database's event ids from another's (its settings' creation time): a database
   * made anew behind the same stream must not have its first events taken for duplicates.
   */
  readonly databaseTag: string
}

export class Outbox extends Context.Service<Outbox, OutboxShape>()("quota-coordinator/Outbox") {}

/** The event id sent as Nats-Msg-Id: stable, so a re-publish after a crash is the same message. */
export const eventIdOf = (databaseTag: string, seq: number): string => `${databaseTag}-${seq}`
