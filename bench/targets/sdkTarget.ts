/**
 * The coordinator through its SDK (src/client/QuotaClient.ts): commands from concurrent callers are
 * coalesced per partition into batch messages, and `unavailable`/`overloaded`/timeouts are retried.
 */
import { QuotaClient } from "../../src/client/QuotaClient.js"
import type { Result } from "../../src/domain/results.js"
import type { StepOutcome, Target } from "./Target.js"
import { makeErrorNote } from "./Target.js"
import { natsUrl, requestTimeoutMs } from "./natsTarget.js"

const refusals: ReadonlyArray<string> = ["insufficient_quota", "busy"]

export const makeSdkTarget = async (prefix: string, partitions: number): Promise<Target> => {
  const client = await QuotaClient.connect({
    servers: natsUrl,
    prefix,
    partitions,
    timeoutMs: requestTimeoutMs
  })
  const errors = makeErrorNote()
  let retriesReported = 0
  /** The first error since the last call, and how many commands the client retried (a retry is not an error). */
  const takeError = (): string | undefined => {
    const retries = client.counters().retries - retriesReported
    retriesReported += retries
    const first = errors.take()
    if (retries === 0) return first
    return `${retries} commands retried by the client${first === undefined ? "" : `; ${first}`}`
  }

  const step = async (
    op: string,
    call: () => Promise<Result>,
    ok: ReadonlyArray<string>
  ): Promise<StepOutcome> => {
    try {
      const result = await call()
      if (ok.includes(result.status)) return "ok"
      if (refusals.includes(result.status)) return "refused"
      errors.note(new Error(`${op}: ${result.status}`))
      return "error"
    } catch (error) {
      errors.note(error)
      return "error"
    }
  }

  const touch = async (users: ReadonlyArray<string>) => {
    const inFlightMax = 1_000
    for (let start = 0; start < users.length; start += inFlightMax) {
      await Promise.all(
        users
          .slice(start, start + inFlightMax)
          .map((user) => step("get_usage", () => client.getUsage({ user }), ["ok"]))
      )
    }
  }

  return {
    key: "coord-sdk",
    label: "coordinator, SDK (batched)",
    durable: true,
    supportsSlots: true,
    notes: [
      "`QuotaClient` from src/client: concurrent commands coalesced per partition into one NATS message (microtask batching), retries on unavailable/overloaded/timeout.",
      "The coordinator runs as `quota-coordinator serve` in its own process (Postgres store with group commit, on a database created for the bench run)."
    ],
    prime: (users) => touch(users),
    reserve: (hold) =>
      step(
        "reserve",
        () => client.reserve({ user: hold.user, meter: hold.meter, amount: hold.amount, id: hold.id }),
        ["reserved", "exists"]
      ),
    consume: (hold, amount, key) =>
      step("consume", () => client.consume({ user: hold.user, id: hold.id, amount, key }), [
        "consumed",
        "exists"
      ]),
    commit: (hold, actual) =>
      step("commit", () => client.commit({ user: hold.user, id: hold.id, amount: actual }), [
        "committed",
        "exists"
      ]),
    release: (hold) =>
      step("release", () => client.release({ user: hold.user, id: hold.id }), ["released", "exists"]),
    acquireSlot: (user, job) =>
      step("acquire_slot", () => client.acquireSlot({ user, job }), ["acquired", "exists"]),
    releaseSlot: (user, job) => step("release_slot", () => client.releaseSlot({ user, job }), ["released"]),
    counters: () => {
      const counters = client.counters()
      return { requests: counters.commandsSent, messages: counters.messagesSent }
    },
    takeError,
    close: () => client.close()
  }
}
