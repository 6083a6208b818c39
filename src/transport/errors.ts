/**
 * The transport's failures, one tagged class each. NATS client errors are mapped to these once, here at
 * the edge; nothing past this module sees a nats.js error.
 */
import { Data } from "effect"

/** The first connection to NATS failed (later disconnects are retried forever by the client). */
export class NatsConnectFailed extends Data.TaggedError("NatsConnectFailed")<{
  readonly servers: string
  readonly reason: string
  /**
   * Whether trying again can help: the network refused or stayed silent (the server is down or out of
   * reach), not a refused authentication, expired credentials or a failed TLS handshake.
   */
  readonly transient?: boolean
  readonly cause?: unknown
}> {
  override get message(): string {
    return `cannot connect to NATS at ${this.servers}: ${this.reason}`
  }
}

/** A subscription could not be made or confirmed by the server (connection closed, permissions). */
export class NatsSubscribeFailed extends Data.TaggedError("NatsSubscribeFailed")<{
  readonly subject: string
  readonly reason: string
  readonly cause?: unknown
}> {
  override get message(): string {
    return `cannot subscribe to ${this.subject}: ${this.reason}`
  }
}

/** A partition number outside 0..P-1 was asked to be served. A caller bug, reported as a value. */
export class PartitionOutOfRange extends Data.TaggedError("PartitionOutOfRange")<{
  readonly partition: number
  readonly partitions: number
}> {
  override get message(): string {
    return `partition ${this.partition} is not in 0..${this.partitions - 1}`
  }
}

/** The text of any thrown value, for logs and error fields. */
export const reasonOf = (cause: unknown): string => (cause instanceof Error ? cause.message : String(cause))
