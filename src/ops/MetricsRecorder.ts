/**
 * The one narrow interface through which the transport, the actors, the store and the ownership round
 * report what they decided, for the metrics `GET /metrics` serves (src/ops/PrometheusMetrics.ts).
 * It knows nothing of Prometheus: `noMetrics` is what runs when the HTTP endpoint is off, and its
 * calls cost an empty function call.
 *
 * Label values must come from closed lists (the protocol's ops and statuses, the configuration's
 * meters and plans), never from what a caller sent (a user id, a job): the implementation maps
 * anything else to `other`, so a series count never grows with traffic.
 */
import { Context } from "effect"

export interface MetricsRecorder {
  /**
   * A command's result was answered: `op` (the decoded op, or the wire's op when it could not be
   * decoded) and its `status`; `seconds` from the message's receipt to its reply.
   */
  readonly commandAnswered: (op: string, status: string, seconds: number) => void
  /** A store commit (one group) finished after `seconds`; `ok` false when it failed. */
  readonly storeCommitted: (seconds: number, ok: boolean) => void
  /** A write was refused because this process no longer owns a partition it touched. */
  readonly writeFenced: () => void
  /** An actor's expiry of a pending hold of `meter` was made durable. */
  readonly holdExpired: (meter: string) => void
  /** An `acquire_slot` was answered `busy` (a snooze) for a user on `plan`. */
  readonly slotBusy: (plan: string) => void
  /** The events stream acknowledged an event of this kind; `duplicate`: it had its id already. */
  readonly eventPublished: (kind: string, duplicate: boolean) => void
}

const ignore = (): void => {}

/** Metrics off: every report is dropped where it is made. */
export const noMetrics: MetricsRecorder = {
  commandAnswered: ignore,
  storeCommitted: ignore,
  writeFenced: ignore,
  holdExpired: ignore,
  slotBusy: ignore,
  eventPublished: ignore
}

/** The recorder as a service, for the parts built from layers (the coordinator). Default: `noMetrics`. */
export class Metrics extends Context.Service<Metrics, MetricsRecorder>()("quota-coordinator/Metrics") {}
