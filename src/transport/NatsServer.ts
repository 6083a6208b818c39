/**
 * The NATS edge: subscribes to `{prefix}.v1.{p}.ops` and `.admin` for the partitions it is told to
 * serve, answers each request with exactly one reply, and answers NATS micro discovery.
 *
 * A request is handled inside the subscription callback by the transport-independent request handler
 * (requestHandler.ts), synchronously up to the point where its commands are enqueued into their users'
 * mailboxes: so commands of one user are decided in message order and, within a batch, in array order.
 * The reply is sent when the last result arrives. Whatever goes wrong after that point (a defect, an
 * interruption at shutdown) answers the affected commands `unavailable`: never silence.
 */
import { Empty, headers, nuid } from "@nats-io/transport-node"
import type { Msg, NatsConnection, Subscription } from "@nats-io/transport-node"
import { Cause, Context, Effect, Exit, Layer, Option, Scope } from "effect"
import { Coordinator } from "../actors/Coordinator.js"
import type { Settings } from "../config/settings.js"
import {
  messageBytesMax,
  natsConnectAttemptTimeoutMs,
  natsPingIntervalMsMin,
  natsPingsOutstandingMax,
  natsReconnectWaitMs,
  natsStartWaitMs,
  subscribeFlushWaitMs,
  subscriptionDrainWaitMs,
  transportDrainMs
} from "../domain/limits.js"
import { headerSafe } from "./body.js"
import type { SubjectKind } from "./decode.js"
import type { ServiceIdentity, ServiceVerb } from "./discovery.js"
import {
  EndpointStats,
  controlSubjects,
  infoResponse,
  packageVersion,
  pingResponse,
  statsResponse
} from "./discovery.js"
import { NatsConnectFailed, NatsSubscribeFailed, PartitionOutOfRange, reasonOf } from "./errors.js"
import type { Logger } from "./log.js"
import { makeRequestHandler } from "./requestHandler.js"
import { connectNats } from "./natsConnect.js"
import type { NatsConnectionSettings } from "../config/natsConnection.js"
import { redactUrl } from "../config/natsConnection.js"
import type { SettingsInvalid } from "../config/SettingsInvalid.js"
import type { MetricsRecorder } from "../ops/MetricsRecorder.js"

export type { WireResult } from "./requestHandler.js"

export interface NatsServerOptions {
  /** `NATS_URL`: one server URL or a comma-separated list (tests; `serve` gives `connection`). */
  readonly servers: string
  /** The connection's servers, authentication and TLS (the environment's NATS_*); overrides `servers`. */
  readonly connection?: NatsConnectionSettings
  readonly prefix: string
  readonly partitions: number
  readonly logger: Logger
  /** Served at start; default every partition 0..P-1. Pass [] to start with none and call servePartitions. */
  readonly initialPartitions?: ReadonlyArray<number>
  /** The version discovery reports; default the package's. */
  readonly version?: string
  /**
   * Queue group of the request subscriptions (default "q", as NATS micro). "per-process": a group of
   * this instance's own (`q-<service id>`), as `serve` uses when scaled out: nats-server keeps a silent
   * client's subscriptions for as long as it delivers to it (it pings only clients that are idle), and
   * in a shared group such a subscription took its share of every request for a partition that the
   * others had taken over (gaps of seconds after the takeover, measured by test/cluster/natsSilent).
   * In groups of their own, each request reaches every process subscribed to its partition: the owner
   * answers; one that no longer owns it answers `unavailable` (not decided) or, gone silent, nothing.
   */
  readonly queueGroup?: string | "per-process"
  /** How long `stop` waits for requests in flight before answering them `unavailable`. */
  readonly drainMs?: number
  /** The client's ping interval (default nats.js's, 2 minutes); serve sets it from the lease. */
  readonly pingIntervalMs?: number
  /** Largest request body (default 1 MiB, as the protocol says); tests lower it to reach the refusal. */
  readonly messageBytesMax?: number
  /** Counts answered commands (default: metrics off). */
  readonly metrics?: MetricsRecorder
  /** How long the start keeps trying to reach NATS while the network refuses (default natsStartWaitMs). */
  readonly startWaitMs?: number
}

/** The options `serve` derives from the environment's settings. */
export const natsServerOptions = (settings: Settings, logger: Logger): NatsServerOptions => ({
  servers: settings.nats.servers.join(","),
  connection: settings.nats,
  prefix: settings.prefix,
  partitions: settings.partitions,
  pingIntervalMs: Math.max(natsPingIntervalMsMin, Math.floor(settings.partitionLeaseMs / 4)),
  logger
})

export interface NatsServerShape {
  /** Subscribes to the partitions' `.ops` and `.admin` subjects; returns once the server has them. */
  readonly servePartitions: (
    partitions: ReadonlyArray<number>
  ) => Effect.Effect<void, NatsSubscribeFailed | PartitionOutOfRange>
  /**
   * Stops taking the partitions' requests and waits (at most the drain time) until what they queued is
   * decided and answered; waiters are answered `unavailable` at once. True when all of it was.
   */
  readonly stopPartitions: (partitions: ReadonlyArray<number>) => Effect.Effect<boolean>
  readonly servedPartitions: () => ReadonlyArray<number>
  /** The micro service id (`$SRV.*.quota-coordinator.<id>`). */
  readonly serviceId: string
  /** Stop taking requests, answer those in flight, close the connection. Idempotent; the layer's finalizer runs it. */
  readonly stop: Effect.Effect<void>
  /** Resolves when the connection closes: an Error if NATS closed it (auth revoked), undefined after `stop`. */
  readonly closed: Effect.Effect<Error | undefined>
  /** Whether the connection is up now (false between a disconnect and the reconnect, and once closed). */
  readonly connected: () => boolean
  /** Told each time the connection goes down (false) or is back (true). */
  readonly onConnectionChange: (listener: (up: boolean) => void) => void
  /** The connection itself, for what shares it (the events publisher's JetStream). */
  readonly connection: NatsConnection
}

export class NatsServer extends Context.Service<NatsServer, NatsServerShape>()(
  "quota-coordinator/NatsServer"
) {}

interface Endpoint {
  readonly partition: number
  readonly kind: SubjectKind
  readonly stats: EndpointStats
}

interface ServedPartition {
  readonly subscriptions: ReadonlyArray<Subscription>
  readonly endpoints: ReadonlyArray<Endpoint>
}

const serviceErrorHeaders = (code: number, reason: string) => {
  const hdrs = headers()
  hdrs.set("Nats-Service-Error-Code", String(code))
  hdrs.set("Nats-Service-Error", headerSafe(reason))
  return hdrs
}

const connectServer = (options: NatsServerOptions) =>
  connectNats(options.connection ?? { servers: options.servers.split(",").map((server) => server.trim()) }, {
    name: "quota-coordinator",
    // Async traces build two Errors with stacks per request (each event's JetStream publish is one):
    // 10.5 % of the process's CPU under the uniform bench with usage_recorded. Failures are logged
    // with the subject and the reason instead.
    noAsyncTraces: true,
    // Keep trying through outages: the client resubscribes on reconnect. An authorization error
    // still ends the connection (nats.js gives up on it), which ends `serve` with the reason.
    maxReconnectAttempts: -1,
    // An attempt begun while the network was silent lost the server's greeting: given up soon, so the
    // process is back soon after the network heals (not when nats.js's 20 s timeout ends).
    timeout: natsConnectAttemptTimeoutMs,
    reconnectTimeWait: natsReconnectWaitMs,
    // A silent connection is only seen by unanswered pings.
    ...(options.pingIntervalMs === undefined
      ? {}
      : { pingInterval: options.pingIntervalMs, maxPingOut: natsPingsOutstandingMax })
  })

/**
 * Connects, trying again while the failure is the network's (refused, silent) for up to `startWaitMs`:
 * a process started during an outage (restarted by its supervisor, or before NATS) waits for it, as a
 * running one rides an outage out, instead of exiting. Credentials and TLS failures end it at once.
 */
const connectServerAtStart = (options: NatsServerOptions) =>
  Effect.gen(function* () {
    const waitUntil = performance.now() + (options.startWaitMs ?? natsStartWaitMs)
    for (let attempt = 1; ; attempt += 1) {
      const startedAt = performance.now()
      const connected = yield* Effect.exit(connectServer(options))
      if (Exit.isSuccess(connected)) {
        if (attempt > 1) options.logger.info({ attempts: attempt }, "nats reached")
        return connected.value
      }
      const error = Cause.findErrorOption(connected.cause)
      const transient =
        Option.isSome(error) && error.value._tag === "NatsConnectFailed" && error.value.transient
      if (!transient || performance.now() >= waitUntil) return yield* Effect.failCause(connected.cause)
      options.logger.warn(
        { attempt, reason: error.value.reason, waitsUntilMs: Math.round(waitUntil - performance.now()) },
        "nats cannot be reached yet: trying again"
      )
      yield* Effect.sleep(Math.max(0, natsReconnectWaitMs - (performance.now() - startedAt)))
    }
  })

export const makeNatsServer = (
  options: NatsServerOptions
): Effect.Effect<
  NatsServerShape,
  NatsConnectFailed | NatsSubscribeFailed | PartitionOutOfRange | SettingsInvalid,
  Coordinator | Scope.Scope
> =>
  Effect.gen(function* () {
    const coordinator = yield* Coordinator
    /**
     * The connected server's max payload, read per reply (a reconnect may reach another server).
     * NATS's default is 1 MiB, the protocol's message limit; requests come only once `nc` is set.
     */
    const maxPayloadBytes = (): number => nc.info?.max_payload ?? messageBytesMax
    const handler = yield* makeRequestHandler({
      logger: options.logger,
      partitions: options.partitions,
      replyBytesMax: maxPayloadBytes,
      ...(options.metrics === undefined ? {} : { metrics: options.metrics }),
      ...(options.messageBytesMax === undefined ? {} : { messageBytesMax: options.messageBytesMax })
    })
    const nc = yield* Effect.acquireRelease(connectServerAtStart(options), (connection) =>
      Effect.promise(() => connection.close().catch(() => undefined))
    )
    const { logger, prefix, partitions } = options
    const drainMs = options.drainMs ?? transportDrainMs
    const served = new Map<number, ServedPartition>()
    const version = options.version ?? packageVersion()
    // A fresh id per instance, as nats.js services make it (a NUID).
    const serviceId = nuid.next()
    const queueGroup = options.queueGroup === "per-process" ? `q-${serviceId}` : (options.queueGroup ?? "q")
    const identity: ServiceIdentity = {
      id: serviceId,
      version,
      description: "Holds, usage limits and fairness slots, decided per user",
      metadata: { prefix, partitions: String(partitions), version },
      started: new Date().toISOString()
    }
    const endpoints = function* (): Generator<EndpointStats> {
      for (const partition of [...served.keys()].sort((left, right) => left - right)) {
        for (const endpoint of served.get(partition)?.endpoints ?? []) yield endpoint.stats
      }
    }

    const respond = (
      msg: Msg,
      body: string,
      bytes: number,
      stats: EndpointStats,
      startedAt: number,
      error?: string
    ) => {
      const maxPayload = maxPayloadBytes()
      let sent: boolean
      try {
        if (bytes > maxPayload) {
          // The handler bounds replies by maxPayload already; this holds if the server's changed since.
          // The commands were decided; a retry of the same ids (in smaller batches) says what stands.
          // 400: the only service error PROTOCOL.md lists.
          error = `reply of ${bytes} bytes is larger than the server's max_payload ${maxPayload}; send smaller batches`
          sent = msg.respond(Empty, { headers: serviceErrorHeaders(400, error) })
          logger.error({ subject: msg.subject, bytes, maxPayload }, "reply too large")
        } else {
          sent = msg.respond(body)
        }
      } catch (cause) {
        sent = false
        logger.error({ subject: msg.subject, error: reasonOf(cause) }, "reply not sent")
      }
      if (!sent && msg.reply !== undefined && msg.reply !== "")
        logger.warn({ subject: msg.subject }, "reply dropped")
      stats.countRequest(startedAt, error)
    }

    const refuse = (msg: Msg, stats: EndpointStats, startedAt: number, code: number, reason: string) => {
      try {
        msg.respond(Empty, { headers: serviceErrorHeaders(code, reason) })
      } catch (cause) {
        logger.error({ subject: msg.subject, error: reasonOf(cause) }, "reply not sent")
      }
      stats.countRequest(startedAt, reason)
    }

    const handleRequest = (msg: Msg, endpoint: Endpoint): void => {
      const startedAt = performance.now()
      const { stats } = endpoint
      const target = { subject: msg.subject, kind: endpoint.kind, partition: endpoint.partition }
      handler.handle(target, msg.data, (handled) =>
        "error" in handled
          ? refuse(msg, stats, startedAt, handled.error.code, handled.error.reason)
          : respond(msg, handled.body, handled.bytes, stats, startedAt, handled.failure)
      )
    }

    const subscribe = (subject: string, queue: string | undefined, callback: (msg: Msg) => void) => {
      const subscription = nc.subscribe(subject, {
        ...(queue === undefined ? {} : { queue }),
        callback: (error, msg) => {
          if (error !== null) logger.error({ subject, error: reasonOf(error) }, "subscription error")
          else callback(msg)
        }
      })
      void subscription.closed.then((closedBy) => {
        if (closedBy instanceof Error)
          logger.error({ subject, error: closedBy.message }, "subscription closed")
      })
      return subscription
    }

    const servePartitions = (requested: ReadonlyArray<number>) =>
      Effect.gen(function* () {
        const outOfRange = requested.find((p) => !Number.isInteger(p) || p < 0 || p >= partitions)
        if (outOfRange !== undefined)
          return yield* new PartitionOutOfRange({ partition: outOfRange, partitions })
        const fresh = [...new Set(requested)].filter((partition) => !served.has(partition))
        for (const partition of fresh) {
          const partitionEndpoints = (["ops", "admin"] as const).map((kind): Endpoint => {
            const subject = `${prefix}.v1.${partition}.${kind}`
            return { partition, kind, stats: new EndpointStats(`${kind}-${partition}`, subject, queueGroup) }
          })
          const subscriptions = yield* Effect.try({
            try: () =>
              partitionEndpoints.map((endpoint) =>
                subscribe(endpoint.stats.subject, queueGroup, (msg) => handleRequest(msg, endpoint))
              ),
            catch: (cause) =>
              new NatsSubscribeFailed({
                subject: `${prefix}.v1.${partition}.*`,
                reason: reasonOf(cause),
                cause
              })
          })
          served.set(partition, { subscriptions, endpoints: partitionEndpoints })
        }
        // One round trip: once the server answers the flush's PING it has every SUB before it. Bounded:
        // a connection gone silent answers nothing until the client's pings give it up, and the
        // ownership round waiting here could not give this process's partitions up meanwhile (a
        // serve that fails is undone and its claim released).
        yield* Effect.tryPromise({
          try: () => nc.flush(),
          catch: (cause) =>
            new NatsSubscribeFailed({ subject: `${prefix}.v1.*`, reason: reasonOf(cause), cause })
        }).pipe(
          Effect.timeoutOrElse({
            duration: subscribeFlushWaitMs,
            orElse: () =>
              Effect.fail(
                new NatsSubscribeFailed({
                  subject: `${prefix}.v1.*`,
                  reason: `the server did not confirm the subscriptions within ${subscribeFlushWaitMs} ms`
                })
              )
          })
        )
        if (fresh.length > 0) logger.info({ partitions: fresh }, "serving partitions")
      })

    /**
     * Stops a subscription: drained while connected (the server stops sending, and what it already sent
     * is handled), at most subscriptionDrainWaitMs; dropped at once otherwise. A drain needs the server's
     * answer, and a process cut off from NATS must still step down at once (it gives its partitions up so
     * that the others serve them): waiting for a reconnect held that for the whole outage.
     */
    const drainQuietly = async (subscription: Subscription): Promise<void> => {
      if (subscription.isClosed()) return
      const drop = () => {
        if (!subscription.isClosed()) subscription.unsubscribe()
      }
      if (!connected) return drop()
      let timer: ReturnType<typeof setTimeout> | undefined
      const waited = new Promise<void>((resolve) => {
        timer = setTimeout(resolve, subscriptionDrainWaitMs)
      })
      await Promise.race([subscription.drain().catch(() => undefined), waited])
      clearTimeout(timer)
      drop()
    }

    const stopPartitions = (requested: ReadonlyArray<number>) =>
      Effect.promise(async () => {
        const stopping = requested.filter((partition) => served.has(partition))
        const subscriptions = stopping.flatMap((partition) => served.get(partition)?.subscriptions ?? [])
        for (const partition of stopping) served.delete(partition)
        // drain: the server stops sending, and messages already received are still handled.
        await Promise.all(subscriptions.map(drainQuietly))
        // What is being decided is answered as decided; a waiter would hold the drain for its whole wait.
        const drained = await Effect.runPromise(coordinator.drainPartitions(stopping, drainMs))
        if (stopping.length > 0) logger.info({ partitions: stopping }, "stopped serving partitions")
        return drained
      })

    const answerDiscovery = (msg: Msg, verb: ServiceVerb): void => {
      const body =
        verb === "PING"
          ? pingResponse(identity)
          : verb === "INFO"
            ? infoResponse(identity, endpoints())
            : statsResponse(identity, endpoints())
      try {
        msg.respond(JSON.stringify(body))
      } catch (cause) {
        logger.error({ subject: msg.subject, error: reasonOf(cause) }, "discovery reply not sent")
      }
    }
    for (const { verb, subject } of controlSubjects(identity.id)) {
      yield* Effect.try({
        try: () => subscribe(subject, undefined, (msg) => answerDiscovery(msg, verb)),
        catch: (cause) => new NatsSubscribeFailed({ subject, reason: reasonOf(cause), cause })
      })
    }

    let stopped: Promise<void> | undefined
    const stopOnce = async (): Promise<void> => {
      const partitionsServed = [...served.keys()]
      if (!(await Effect.runPromise(stopPartitions(partitionsServed)))) {
        logger.warn("drain timed out; answering the rest unavailable")
        // Answered while the connection can still carry the replies.
        await Effect.runPromise(coordinator.dropPartitions(partitionsServed))
      }
      await nc.drain().catch(() => undefined)
      logger.info("nats transport stopped")
    }
    const stop = Effect.promise(() => (stopped ??= stopOnce()))

    const closed = nc.closed().then((error) => (error instanceof Error ? error : undefined))
    void closed.then((error) => {
      if (error !== undefined) logger.error({ error: error.message }, "nats connection closed")
    })
    let connected = true
    const connectionListeners: Array<(up: boolean) => void> = []
    const connectionChanged = (up: boolean): void => {
      if (connected === up) return
      connected = up
      for (const listener of connectionListeners) listener(up)
    }
    void (async () => {
      for await (const status of nc.status()) {
        if (status.type === "disconnect") connectionChanged(false)
        else if (status.type === "reconnect") connectionChanged(true)
        if (status.type === "disconnect" || status.type === "reconnect" || status.type === "error") {
          logger.warn(
            {
              status: status.type,
              server: "server" in status ? redactUrl(status.server) : undefined,
              error: status.type === "error" ? reasonOf(status.error) : undefined
            },
            "nats status"
          )
        }
      }
    })()

    yield* Effect.addFinalizer(() => stop)
    yield* servePartitions(
      options.initialPartitions ?? Array.from({ length: partitions }, (_, index) => index)
    )
    logger.info(
      { prefix, partitions, serviceId: identity.id, version: identity.version },
      "nats transport ready"
    )

    return {
      servePartitions,
      stopPartitions,
      servedPartitions: () => [...served.keys()].sort((left, right) => left - right),
      serviceId: identity.id,
      stop,
      closed: Effect.promise(() => closed),
      connected: () => connected && !nc.isClosed(),
      onConnectionChange: (listener) => {
        connectionListeners.push(listener)
      },
      connection: nc
    }
  })

export const natsServerLayer = (
  options: NatsServerOptions
): Layer.Layer<
  NatsServer,
  NatsConnectFailed | NatsSubscribeFailed | PartitionOutOfRange | SettingsInvalid,
  Coordinator
> => Layer.effect(NatsServer, makeNatsServer(options))
