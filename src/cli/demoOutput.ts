/** Output helpers of the demo and how it sends wire messages (NATS or the in-process transport). */
import { connect } from "@nats-io/transport-node"
import type { NatsConnection } from "@nats-io/transport-node"
import type { LocalTransportShape } from "../transport/LocalTransport.js"
import { reasonOf } from "../transport/errors.js"

// ---------------------------------------------------------------------------------------------------
// Output

export const color = (enabled: boolean) => {
  const wrap = (code: string) => (text: string) => (enabled ? `\u001b[${code}m${text}\u001b[0m` : text)
  return { green: wrap("32"), red: wrap("31"), bold: wrap("1"), dim: wrap("2") }
}

/** 4985 -> "4 985", as the seeds write numbers. */
export const grouped = (value: number): string =>
  Math.round(value)
    .toString()
    .replace(/\B(?=(\d{3})+(?!\d))/g, " ")

export const seconds = (ms: number): string => `${(ms / 1000).toFixed(1)} s`

export const milliseconds = (ms: number): string => `${ms < 10 ? ms.toFixed(1) : Math.round(ms)} ms`

export const percentile = (sorted: ReadonlyArray<number>, fraction: number): number =>
  sorted.length === 0
    ? 0
    : (sorted[Math.min(sorted.length - 1, Math.floor(fraction * sorted.length))] as number)

// ---------------------------------------------------------------------------------------------------
// The wire: NATS or in-process, the same subjects and bytes

/** Sends a request body to a subject and resolves with the reply body; a service error rejects. */
export interface Wire {
  readonly request: (subject: string, body: string) => Promise<string>
}

const serviceError = (headers: { get(name: string): string } | undefined): Error | undefined => {
  const code = headers?.get("Nats-Service-Error-Code") ?? ""
  return code === ""
    ? undefined
    : new Error(`service error ${code}: ${headers?.get("Nats-Service-Error") ?? ""}`)
}

export const natsWire = (connection: NatsConnection): Wire => ({
  request: async (subject, body) => {
    const msg = await connection.request(subject, body, { timeout: 30_000 })
    const error = serviceError(msg.headers)
    if (error !== undefined) throw error
    return msg.string()
  }
})

const decoder = new TextDecoder()

export const localWire = (transport: Pick<LocalTransportShape, "request">): Wire => ({
  request: async (subject, body) => {
    const reply = await transport.request(subject, body)
    const headers = reply.headers
    const error = serviceError(headers === undefined ? undefined : { get: (name) => headers[name] ?? "" })
    if (error !== undefined) throw error
    return decoder.decode(reply.data)
  }
})

/** NATS at `servers` if it answers within `timeoutMs`, else the reason it did not. */
export const probeNats = async (
  servers: string,
  timeoutMs: number
): Promise<NatsConnection | { reason: string }> => {
  try {
    return await connect({
      servers: servers.split(",").map((server) => server.trim()),
      name: "quota-coordinator-demo",
      timeout: timeoutMs,
      reconnect: false
    })
  } catch (cause) {
    return { reason: reasonOf(cause) }
  }
}
