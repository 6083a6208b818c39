/**
 * A minimal wire client for process tests: one JSON command per request, retried with the same
 * ids on `unavailable`, `overloaded`, no responders and timeouts, as PROTOCOL.md says a client does.
 */
import type { NatsConnection } from "@nats-io/transport-node"
import { partitionOf } from "../../src/domain/partition.js"

export type WireResult = Record<string, unknown> & { readonly status: string }

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

export interface WireTarget {
  readonly nc: NatsConnection
  readonly prefix: string
  readonly partitions: number
}

/** Sends until a decided answer arrives or `deadlineMs` passes (then throws: the test fails loudly). */
export const requestUntilDecided = async (
  target: WireTarget,
  command: Record<string, unknown> & { user: string },
  options: { readonly kind?: "ops" | "admin"; readonly deadlineMs?: number; readonly timeoutMs?: number } = {}
): Promise<{ result: WireResult; attempts: number }> => {
  const subject = `${target.prefix}.v1.${partitionOf(command.user, target.partitions)}.${options.kind ?? "ops"}`
  const deadline = Date.now() + (options.deadlineMs ?? 30_000)
  let attempts = 0
  let delayMs = 20
  for (;;) {
    attempts += 1
    try {
      const reply = await target.nc.request(subject, JSON.stringify(command), {
        timeout: options.timeoutMs ?? 2_000
      })
      const result = reply.json<WireResult>()
      if (result.status !== "unavailable" && result.status !== "overloaded") return { result, attempts }
    } catch {
      // No responders or a timeout: nobody owns the partition right now, or the owner died mid-request.
    }
    if (Date.now() > deadline)
      throw new Error(`no decided answer for ${JSON.stringify(command)} after ${attempts} attempts`)
    await sleep(delayMs)
    delayMs = Math.min(500, delayMs * 2)
  }
}
