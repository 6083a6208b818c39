/**
 * The in-process transport: the NATS service's request/reply without a NATS server, for the demo on a
 * machine with nothing installed. A request names the same subject a NATS client would send to
 * (`{prefix}.v1.{partition}.ops|admin`), carries the same bytes, and goes through the same request
 * handler as the NATS server's (requestHandler.ts): same judging, same coordinator, same reply body, and
 * the same service error headers for a body that is refused. A subject nothing serves rejects with
 * `LocalNoResponders`, as NATS answers no responders.
 */
import { Context, Data, Effect, Layer } from "effect"
import type { Scope } from "effect"
import { Coordinator } from "../actors/Coordinator.js"
import { transportDrainMs } from "../domain/limits.js"
import { headerSafe } from "./body.js"
import type { SubjectKind } from "./decode.js"
import type { Logger } from "./log.js"
import type { RequestTarget } from "./requestHandler.js"
import { makeRequestHandler } from "./requestHandler.js"

export interface LocalTransportOptions {
  readonly prefix: string
  readonly partitions: number
  readonly logger: Logger
  /** How long `stop` waits for requests in flight before answering them `unavailable`. */
  readonly drainMs?: number
  /** Largest request body (default 1 MiB, as the protocol says). */
  readonly messageBytesMax?: number
}

/** A reply as a NATS client sees it: the body's bytes and, for a service error, its headers. */
export interface LocalReply {
  readonly data: Uint8Array
  readonly headers: Readonly<Record<string, string>> | undefined
}

/** No one serves the subject (NATS: status 503, no responders), or the transport has stopped. */
export class LocalNoResponders extends Data.TaggedError("LocalNoResponders")<{ readonly subject: string }> {
  override get message(): string {
    return `no responders on ${this.subject}`
  }
}

export interface LocalTransportShape {
  /** Sends one request body to a subject and resolves with the reply; the commands are enqueued before it returns. */
  readonly request: (subject: string, data: string | Uint8Array) => Promise<LocalReply>
  /** Stop taking requests, answer those in flight (or, after drainMs, answer them `unavailable`). Idempotent. */
  readonly stop: Effect.Effect<void>
}

export class LocalTransport extends Context.Service<LocalTransport, LocalTransportShape>()(
  "quota-coordinator/LocalTransport"
) {}

const encoder = new TextEncoder()

/** `{prefix}.v1.{partition}.{kind}` to its target, or undefined when it is no served subject. */
const targetOf = (subject: string, prefix: string, partitions: number): RequestTarget | undefined => {
  const head = `${prefix}.v1.`
  if (!subject.startsWith(head)) return undefined
  const [partitionText, kind, ...rest] = subject.slice(head.length).split(".")
  if (rest.length > 0 || partitionText === undefined || !/^(0|[1-9]\d*)$/.test(partitionText))
    return undefined
  const partition = Number(partitionText)
  if (partition >= partitions || (kind !== "ops" && kind !== "admin")) return undefined
  return { subject, kind: kind satisfies SubjectKind, partition }
}

export const makeLocalTransport = (
  options: LocalTransportOptions
): Effect.Effect<LocalTransportShape, never, Coordinator | Scope.Scope> =>
  Effect.gen(function* () {
    const coordinator = yield* Coordinator
    const handler = yield* makeRequestHandler({
      logger: options.logger,
      partitions: options.partitions,
      ...(options.messageBytesMax === undefined ? {} : { messageBytesMax: options.messageBytesMax })
    })
    const drainMs = options.drainMs ?? transportDrainMs
    let open = true

    const request = (subject: string, data: string | Uint8Array): Promise<LocalReply> => {
      const target = open ? targetOf(subject, options.prefix, options.partitions) : undefined
      if (target === undefined) return Promise.reject(new LocalNoResponders({ subject }))
      return handler
        .request(target, typeof data === "string" ? encoder.encode(data) : data)
        .then((handled) =>
          "error" in handled
            ? {
                data: new Uint8Array(0),
                headers: {
                  "Nats-Service-Error-Code": String(handled.error.code),
                  "Nats-Service-Error": headerSafe(handled.error.reason)
                }
              }
            : { data: encoder.encode(handled.body), headers: undefined }
        )
    }

    let stopped: Promise<void> | undefined
    const stopOnce = async (): Promise<void> => {
      open = false
      // What is being decided is answered as decided; a waiter would hold the drain for its whole wait.
      if (!(await Effect.runPromise(coordinator.drainPartitions("all", drainMs)))) {
        options.logger.warn("drain timed out; answering the rest unavailable")
        await Effect.runPromise(coordinator.dropPartitions("all"))
      }
      options.logger.info("in-process transport stopped")
    }
    const stop = Effect.promise(() => (stopped ??= stopOnce()))
    yield* Effect.addFinalizer(() => stop)
    options.logger.info(
      { prefix: options.prefix, partitions: options.partitions },
      "in-process transport ready"
    )
    return { request, stop }
  })

export const localTransportLayer = (
  options: LocalTransportOptions
): Layer.Layer<LocalTransport, never, Coordinator> =>
  Layer.effect(LocalTransport, makeLocalTransport(options))
