/** Output helpers of the demo and how it sends wire messages (NATS or the in-process transport). */
import type { NatsConnection } from "@nats-io/transport-node"
import { Effect, Result } from "effect"
import type { NatsConnectionSettings } from "../config/natsConnection.js"
import { connectNats } from "../transport/natsConnect.js"
import type { LocalTransportShape } from "../transport/LocalTransport.js"

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

/** NATS as configured if it answers within `timeoutMs`, else the reason it did not. */
export const probeNats = async (
  settings: NatsConnectionSettings,
  timeoutMs: number
): Promise<NatsConnection | { reason: string }> => {
  const connected = await Effect.runPromise(
    Effect.result(
      connectNats(settings, { name: "quota-coordinator-demo", timeout: timeoutMs, reconnect: false })
    )
  )
  return Result.isSuccess(connected) ? connected.success : { reason: connected.failure.message }
}
