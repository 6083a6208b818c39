/**
 * The outbox port: events recorded with their changes (src/store/postgres/writeEvents.ts), read by the
 * publisher of their partition in order and removed once the stream has them.
 */
import { Context } from "effect"
import type { Effect } from "effect"
import type { QuotaEventKind } from "../domain/events.js"
import type { StoreUnavailable } from "../store/Store.js"

export interface OutboxRow {
  /** Order of recording; with the database's tag and the incarnation, the event's id. */
  readonly seq: number
  /**
   * The database's incarnation the row was recorded in (src/store/postgres/incarnation.ts): seq goes
   * back after a promotion or a restore, the pair does not. "" for rows recorded before it was stamped.
   */
  readonly incarnation: string
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

/**
 * The event id sent as Nats-Msg-Id: `<database tag>-<incarnation>-<seq>` (`<database tag>-<seq>` for a
 * row recorded before incarnations were stamped). Stable, so a re-publish after a crash is the same
 * message; unique across promotions and restores, as seq alone is not.
 */
export const eventIdOf = (databaseTag: string, row: Pick<OutboxRow, "incarnation" | "seq">): string =>
  row.incarnation === "" ? `${databaseTag}-${row.seq}` : `${databaseTag}-${row.incarnation}-${row.seq}`

/** Where an event id of this database's stands: its incarnation and seq; undefined for another's. */
export const outboxPositionOf = (
  databaseTag: string,
  eventId: string
): Pick<OutboxRow, "incarnation" | "seq"> | undefined => {
  const tagged = `${databaseTag}-`
  if (!eventId.startsWith(tagged)) return undefined
  const parts = eventId.slice(tagged.length).split("-")
  if (parts.length > 2) return undefined
  const incarnation = parts.length === 2 ? parts[0]! : ""
  const seqText = parts[parts.length - 1]!
  const seq = Number(seqText)
  if (!/^[0-9a-z]*$/.test(incarnation) || !/^[1-9][0-9]*$/.test(seqText) || !Number.isSafeInteger(seq))
    return undefined
  return { incarnation, seq }
}
