/**
 * The events' part of `serve`: the stream made sure of at start (a failure is a warning: decisions go
 * on and events wait in the log), and the publisher whose partitions follow what the process serves.
 */
import type { NatsConnection } from "@nats-io/transport-node"
import { Effect, Exit } from "effect"
import type { Scope } from "effect"
import type { EventSettings } from "../config/eventSettings.js"
import type { MetricsRecorder } from "../ops/MetricsRecorder.js"
import type { Logger } from "../transport/log.js"
import type { EventPublisher } from "./EventPublisher.js"
import { makeEventPublisher } from "./EventPublisher.js"
import { makeJetStreamSink } from "./JetStreamSink.js"
import type { EventLogShape } from "./EventLog.js"
import type { EventQueue } from "./EventQueue.js"

export interface StartEventsOptions {
  readonly settings: EventSettings
  readonly prefix: string
  readonly connection: NatsConnection
  readonly log: EventLogShape
  readonly queue: EventQueue
  readonly servable: (partition: number) => boolean
  /** Resolves once the partition's log is opened here (see EventPublisherOptions.opened). */
  readonly opened?: (partition: number) => Effect.Effect<void>
  readonly metrics: MetricsRecorder
  readonly logger: Logger
}

/** The publisher (none with QUOTA_EVENTS_ENABLED=false); its fibers end with the scope. */
export const startEvents = (
  options: StartEventsOptions
): Effect.Effect<EventPublisher | undefined, never, Scope.Scope> =>
  Effect.gen(function* () {
    if (!options.settings.enabled) return undefined
    const sink = makeJetStreamSink(options.connection, options.prefix, options.settings)
    const ensured = yield* Effect.exit(sink.ensureStream)
    if (Exit.isFailure(ensured))
      options.logger.warn(
        { stream: options.settings.streamName, error: String(ensured.cause) },
        "the events stream is not available yet; events wait in the log until it is"
      )
    else options.logger.info({ stream: options.settings.streamName }, "events stream ready")
    return yield* makeEventPublisher({
      log: options.log,
      sink,
      queue: options.queue,
      duplicateWindowMs: options.settings.duplicateWindowMs,
      prefix: options.prefix,
      servable: options.servable,
      ...(options.opened === undefined ? {} : { opened: options.opened }),
      metrics: options.metrics,
      warn: (message, fields) =>
        options.logger.warn({ stream: options.settings.streamName, ...fields }, message)
    })
  })
