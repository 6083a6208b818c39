/**
 * The operations endpoint of `serve` (`QUOTA_HTTP_ADDR`): `GET /metrics` (Prometheus text, from
 * prom-client), `GET /healthz` (200 while the process runs its loop) and `GET /readyz` (200 when
 * connected to NATS and Postgres answers, else 503 naming what is down). Nothing else: any other
 * path is 404, any other method 405. It lives as long as its scope; binding fails fast with the
 * address in the error.
 *
 * Whoever can reach the port may be careless or hostile, and must not keep /healthz from answering
 * nor cost the process's one thread: a socket that sends nothing is closed after
 * httpIdleSocketTimeoutMs, one that has not sent whole headers within httpHeadersTimeoutMs (checked
 * every httpTimeoutCheckIntervalMs, not Node's 30 s) likewise, headers are capped
 * at httpHeaderBytesMax (431), and no endpoint takes a body, so a request that announces one is
 * answered 413 and its connection closed, as is every 404 and 405: Node would otherwise read and
 * discard the body to keep the connection, however long it is.
 */
import { createServer } from "node:http"
import type { IncomingMessage, Server, ServerResponse } from "node:http"
import type { AddressInfo } from "node:net"
import { Data, Effect } from "effect"
import type { Scope } from "effect"
import {
  httpConnectionsMax,
  httpHeaderBytesMax,
  httpHeadersTimeoutMs,
  httpIdleSocketTimeoutMs,
  httpKeepAliveTimeoutMs,
  httpRequestTimeoutMs,
  httpTimeoutCheckIntervalMs
} from "../domain/limits.js"
import type { PrometheusMetrics } from "./PrometheusMetrics.js"
import type { Readiness } from "./Readiness.js"

/** The address could not be bound (in use, not local, no permission). */
export class HttpListenFailed extends Data.TaggedError("HttpListenFailed")<{
  readonly address: string
  readonly reason: string
}> {
  override get message(): string {
    return `QUOTA_HTTP_ADDR ${this.address}: cannot listen: ${this.reason}`
  }
}

export interface HttpServerOptions {
  readonly host: string
  readonly port: number
  readonly metrics: PrometheusMetrics
  readonly readiness: Readiness
  /** Told of a scrape that failed (a bug in a collector): the scrape answers 500. */
  readonly onError: (message: string, cause: unknown) => void
}

export interface OpsHttpServer {
  /** The bound port (the one the OS chose when asked for 0). */
  readonly port: number
  /** `host:port` as bound, for logs. */
  readonly address: string
}

/** `close`: the connection ends after this response; whatever the request still sends is not read. */
const json = (response: ServerResponse, status: number, body: unknown, close = false): void => {
  const text = JSON.stringify(body)
  response.writeHead(status, {
    "content-type": "application/json; charset=utf-8",
    "content-length": Buffer.byteLength(text),
    "cache-control": "no-store",
    ...(close ? { connection: "close" } : {})
  })
  response.end(text)
}

/** A request that announces a body (chunked, or a length above 0): none of the endpoints reads one. */
const hasBody = (request: IncomingMessage): boolean =>
  request.headers["transfer-encoding"] !== undefined ||
  (request.headers["content-length"] !== undefined && request.headers["content-length"] !== "0")

const route = (options: HttpServerOptions) => (request: IncomingMessage, response: ServerResponse) => {
  const path = (request.url ?? "/").split("?", 1)[0]
  if (path !== "/metrics" && path !== "/healthz" && path !== "/readyz")
    return json(response, 404, { error: `no such endpoint ${path}; try /metrics, /healthz or /readyz` }, true)
  if (request.method !== "GET" && request.method !== "HEAD") {
    response.setHeader("allow", "GET, HEAD")
    return json(response, 405, { error: `${request.method} is not allowed; use GET` }, true)
  }
  if (hasBody(request)) return json(response, 413, { error: "these endpoints take no request body" }, true)
  switch (path) {
    case "/healthz":
      return json(response, 200, { status: "ok" })
    case "/readyz": {
      const report = options.readiness.report()
      const unowned =
        report.unownedPartitions.length === 0 ? {} : { unownedPartitions: report.unownedPartitions }
      return report.ready
        ? json(response, 200, { status: "ready", ...unowned })
        : json(response, 503, { status: "not_ready", down: report.down, reasons: report.reasons, ...unowned })
    }
    default:
      options.metrics.scrape().then(
        ({ contentType, body }) => {
          response.writeHead(200, { "content-type": contentType, "content-length": Buffer.byteLength(body) })
          response.end(body)
        },
        (cause: unknown) => {
          options.onError("metrics scrape failed", cause)
          json(response, 500, { error: "metrics scrape failed" })
        }
      )
  }
}

const formatAddress = (host: string, port: number): string =>
  host.includes(":") ? `[${host}]:${port}` : `${host}:${port}`

/** Listens until the scope closes (then stops taking connections and closes idle ones). */
export const startHttpServer = (
  options: HttpServerOptions
): Effect.Effect<OpsHttpServer, HttpListenFailed, Scope.Scope> =>
  Effect.acquireRelease(
    Effect.callback<{ server: Server; bound: OpsHttpServer }, HttpListenFailed>((resume) => {
      const server = createServer(
        { connectionsCheckingInterval: httpTimeoutCheckIntervalMs, maxHeaderSize: httpHeaderBytesMax },
        route(options)
      )
      server.maxConnections = httpConnectionsMax
      server.requestTimeout = httpRequestTimeoutMs
      server.headersTimeout = httpHeadersTimeoutMs
      server.keepAliveTimeout = httpKeepAliveTimeoutMs
      // Without a 'timeout' listener, Node destroys a socket idle this long (no byte either way).
      server.timeout = httpIdleSocketTimeoutMs
      const onError = (error: Error) =>
        resume(
          Effect.fail(
            new HttpListenFailed({
              address: formatAddress(options.host, options.port),
              reason: error.message
            })
          )
        )
      server.once("error", onError)
      server.listen(options.port, options.host, () => {
        server.off("error", onError)
        const { port } = server.address() as AddressInfo
        resume(Effect.succeed({ server, bound: { port, address: formatAddress(options.host, port) } }))
      })
    }),
    ({ server }) =>
      Effect.callback<void>((resume) => {
        server.close(() => resume(Effect.void))
        server.closeIdleConnections()
      })
  ).pipe(Effect.map(({ bound }) => bound))
