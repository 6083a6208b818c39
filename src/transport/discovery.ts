/**
 * NATS micro discovery (ADR-32) answered by hand: `$SRV.PING|INFO|STATS`, each also as
 * `.quota-coordinator` and `.quota-coordinator.<id>`. The bodies are plain JSON of the types
 * `io.nats.micro.v1.ping_response`, `info_response` and `stats_response`; times are nanoseconds.
 * Every served subject (`{prefix}.v1.{p}.ops|admin`) is one endpoint with its own counters.
 */
import { readFileSync } from "node:fs"
import { dirname, join } from "node:path"
import { fileURLToPath } from "node:url"

export const serviceName = "quota-coordinator"
export const serviceVerbs = ["PING", "INFO", "STATS"] as const
export type ServiceVerb = (typeof serviceVerbs)[number]

/** The nine control subjects one instance answers. */
export const controlSubjects = (id: string): ReadonlyArray<{ verb: ServiceVerb; subject: string }> =>
  serviceVerbs.flatMap((verb) => [
    { verb, subject: `$SRV.${verb}` },
    { verb, subject: `$SRV.${verb}.${serviceName}` },
    { verb, subject: `$SRV.${verb}.${serviceName}.${id}` }
  ])

export class EndpointStats {
  numRequests = 0
  numErrors = 0
  lastError = ""
  processingTimeNs = 0

  constructor(
    readonly name: string,
    readonly subject: string,
    readonly queueGroup: string
  ) {}

  /** Counts one answered request and how long it took from arrival to reply. */
  countRequest(startedAtMs: number, error?: string): void {
    this.numRequests += 1
    this.processingTimeNs += Math.round((performance.now() - startedAtMs) * 1_000_000)
    if (error !== undefined) {
      this.numErrors += 1
      this.lastError = error
    }
  }
}

export interface ServiceIdentity {
  readonly id: string
  readonly version: string
  readonly metadata: Readonly<Record<string, string>>
  readonly description: string
  /** ISO time the service started (reset never happens here: counters live as long as the process). */
  readonly started: string
}

export const pingResponse = (identity: ServiceIdentity) => ({
  type: "io.nats.micro.v1.ping_response",
  name: serviceName,
  id: identity.id,
  version: identity.version,
  metadata: identity.metadata
})

export const infoResponse = (identity: ServiceIdentity, endpoints: Iterable<EndpointStats>) => ({
  type: "io.nats.micro.v1.info_response",
  name: serviceName,
  id: identity.id,
  version: identity.version,
  description: identity.description,
  metadata: identity.metadata,
  endpoints: [...endpoints].map((endpoint) => ({
    name: endpoint.name,
    subject: endpoint.subject,
    queue_group: endpoint.queueGroup,
    metadata: null
  }))
})

export const statsResponse = (identity: ServiceIdentity, endpoints: Iterable<EndpointStats>) => ({
  type: "io.nats.micro.v1.stats_response",
  name: serviceName,
  id: identity.id,
  version: identity.version,
  started: identity.started,
  metadata: identity.metadata,
  endpoints: [...endpoints].map((endpoint) => ({
    name: endpoint.name,
    subject: endpoint.subject,
    queue_group: endpoint.queueGroup,
    num_requests: endpoint.numRequests,
    num_errors: endpoint.numErrors,
    last_error: endpoint.lastError,
    processing_time: endpoint.processingTimeNs,
    average_processing_time:
      endpoint.numRequests === 0 ? 0 : Math.round(endpoint.processingTimeNs / endpoint.numRequests)
  }))
})

/**
 * The version in the project's package.json, found by walking up from this file: the same code runs from
 * src/transport (tsx, vitest) and dist/src/transport (built), at different depths.
 */
export const packageVersion = (): string => {
  let directory = dirname(fileURLToPath(import.meta.url))
  for (let depth = 0; depth < 6; depth += 1) {
    try {
      const packageJson = JSON.parse(readFileSync(join(directory, "package.json"), "utf8")) as {
        name?: string
        version?: string
      }
      if (packageJson.name === serviceName && typeof packageJson.version === "string") {
        return packageJson.version
      }
    } catch {
      // No package.json at this level: keep walking up.
    }
    directory = dirname(directory)
  }
  return "0.0.0"
}
