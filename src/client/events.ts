/**
 * Reading the coordinator's events (PROTOCOL.md "Events") from their JetStream stream: a pull consumer
 * with explicit acks, as an async iterator. A durable consumer keeps its place across restarts of the
 * reader; an event not acknowledged within the ack wait (30 s) is delivered again, so a reader that
 * crashes mid-way loses nothing (and must tolerate a repeat: `eventId` tells them apart).
 *
 * NATS servers before 2.10 take one filter subject per consumer: asked for several kinds (or all), the
 * consumer reads every event and the iterator acknowledges, and skips, the kinds not asked for.
 */
import type { Consumer, ConsumerMessages, JsMsg } from "@nats-io/jetstream"
import {
  AckPolicy,
  DeliverPolicy,
  JetStreamApiCodes,
  JetStreamApiError,
  jetstream,
  jetstreamManager
} from "@nats-io/jetstream"
import type { NatsConnection } from "@nats-io/transport-node"
import { defaultStreamName } from "../config/eventSettings.js"
import type { QuotaEvent, QuotaEventKind } from "../domain/events.js"

/**
 * `usage_recorded` (revision 1.3): a decision that changed a meter's `used`. Per user, meter and
 * period the `amount`s of these events add up to that period's `used`, exactly: a billing system that
 * keeps one per `eventId` charges what the coordinator enforced.
 */
export type UsageRecordedEvent = Extract<QuotaEvent, { readonly event: "usage_recorded" }>

/** An event as published: what the decision recorded, with its id, user and partition. */
export type QuotaEventMessage = QuotaEvent & {
  readonly eventId: string
  readonly user: string
  readonly partition: number
}

export interface EventsOptions {
  /** Only these kinds (default: every kind). */
  readonly kinds?: ReadonlyArray<QuotaEventKind>
  /**
   * A durable consumer's name: the stream remembers what it acknowledged, and a reader started again
   * with the same name goes on from there. Without it, an ephemeral consumer from the stream's start,
   * removed by the server a few minutes after the reader stops.
   */
  readonly durable?: string
  /** The stream (default the prefix's: `QUOTA_EVENTS` for `quota`, or what QUOTA_EVENTS_STREAM names). */
  readonly stream?: string
  /** Start at events published from now on instead of at the stream's oldest (a new consumer only). */
  readonly onlyNew?: boolean
  /** Events fetched ahead of the reader at most (default 256). */
  readonly prefetch?: number
}

/** One delivered event and how to settle it. */
export interface EventDelivery {
  readonly event: QuotaEventMessage
  /** Done with it: it is not delivered to this consumer again. */
  readonly ack: () => void
  /** Not now: deliver it again (after `delayMs`, default at once). */
  readonly nak: (delayMs?: number) => void
  /** Never: drop it for this consumer (a poison message). */
  readonly term: () => void
}

export interface EventSubscription extends AsyncIterable<EventDelivery> {
  /** The consumer's name (the durable's, or the server's for an ephemeral one). */
  readonly consumer: string
  /** Stops fetching; the iterator ends after what it already holds. */
  readonly stop: () => Promise<void>
}

const ackWaitNanos = 30_000_000_000
const ephemeralInactiveNanos = 300_000_000_000

const isNotFound = (error: unknown): boolean =>
  error instanceof JetStreamApiError && error.code === JetStreamApiCodes.ConsumerNotFound

/** Subscribes to the events of `prefix`'s stream; resolves once the consumer exists on the server. */
export const subscribeEvents = async (
  nc: NatsConnection,
  prefix: string,
  options: EventsOptions = {}
): Promise<EventSubscription> => {
  const stream = options.stream ?? defaultStreamName(prefix)
  const kinds = options.kinds === undefined || options.kinds.length === 0 ? undefined : new Set(options.kinds)
  const filterSubject =
    kinds !== undefined && kinds.size === 1
      ? `${prefix}.v1.events.${[...kinds][0]}.*`
      : `${prefix}.v1.events.>`
  // No $JS.API.INFO round trip: a reader may be granted only the consumer API of its stream.
  const manager = await jetstreamManager(nc, { checkAPI: false })
  const config = {
    ack_policy: AckPolicy.Explicit,
    ack_wait: ackWaitNanos,
    filter_subject: filterSubject,
    deliver_policy: options.onlyNew === true ? DeliverPolicy.New : DeliverPolicy.All
  }
  let name: string
  if (options.durable === undefined) {
    name = (await manager.consumers.add(stream, { ...config, inactive_threshold: ephemeralInactiveNanos }))
      .name
  } else {
    name = options.durable
    try {
      const existing = await manager.consumers.info(stream, name)
      if (existing.config.filter_subject !== filterSubject)
        await manager.consumers.update(stream, name, { filter_subject: filterSubject })
    } catch (error) {
      if (!isNotFound(error)) throw error
      await manager.consumers.add(stream, { ...config, durable_name: name })
    }
  }
  const consumer: Consumer = await jetstream(nc, { checkAPI: false }).consumers.get(stream, name)
  const messages: ConsumerMessages = await consumer.consume({ max_messages: options.prefetch ?? 256 })

  const deliveries = async function* (): AsyncGenerator<EventDelivery> {
    for await (const message of messages as AsyncIterable<JsMsg>) {
      const event = message.json<QuotaEventMessage>()
      if (kinds !== undefined && !kinds.has(event.event)) {
        message.ack()
        continue
      }
      yield {
        event,
        ack: () => message.ack(),
        nak: (delayMs) => message.nak(delayMs),
        term: () => message.term()
      }
    }
  }

  return {
    consumer: name,
    stop: async () => {
      await messages.close()
    },
    [Symbol.asyncIterator]: deliveries
  }
}
