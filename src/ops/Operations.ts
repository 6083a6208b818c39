/**
 * What `serve` runs for its operators when `QUOTA_HTTP_ADDR` is not `off`: the metrics registry, the
 * readiness checks and the HTTP server over both. Bound first, before NATS or Postgres, so a probe
 * gets an answer (503, starting) while the rest connects, and a taken port fails the start at once.
 */
import { Effect } from "effect"
import type { Scope } from "effect"
import type { HttpAddress } from "../config/settings.js"
import type { Config } from "../domain/config.js"
import type { OpsHttpServer } from "./HttpServer.js"
import { HttpListenFailed, startHttpServer } from "./HttpServer.js"
import type { PrometheusMetrics } from "./PrometheusMetrics.js"
import { makePrometheusMetrics } from "./PrometheusMetrics.js"
import type { Readiness, ReadinessChange } from "./Readiness.js"
import { makeReadiness } from "./Readiness.js"

export interface Operations {
  readonly metrics: PrometheusMetrics
  readonly readiness: Readiness
  readonly http: OpsHttpServer
}

export const startOperations = (
  address: HttpAddress,
  config: Config,
  onError: (message: string, cause: unknown) => void,
  /** Told when a dependency goes down or comes back, with the cause /readyz does not show. */
  onReadinessChange: (change: ReadinessChange) => void = () => {}
): Effect.Effect<Operations, HttpListenFailed, Scope.Scope> =>
  Effect.gen(function* () {
    const metrics = makePrometheusMetrics({
      meters: config.meters.map((meter) => meter.name),
      plans: Object.keys(config.plans)
    })
    const readiness = makeReadiness(onReadinessChange)
    const http = yield* startHttpServer({ ...address, metrics, readiness, onError })
    return { metrics, readiness, http }
  })

export { HttpListenFailed }
