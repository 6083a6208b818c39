/**
 * The coordinator through its SDK (src/client/QuotaClient.ts): commands from concurrent callers are
 * coalesced per partition into batch messages, and `unavailable`/`overloaded`/timeouts are retried.
 * The same client speaks to the floor (floorServer.ts), which answers on the same subjects.
 */
import { QuotaClient } from "../../src/client/QuotaClient.js"
import type { Result } from "../../src/domain/results.js"
import type { StepOutcome, Target } from "./Target.js"
import { inChunks, makeErrorNote } from "./Target.js"
import { natsUrl, outcomeOf, requestTimeoutMs } from "./natsTarget.js"

/** Which server behind the prefix: the coordinator (default) or the floor. */
export interface SdkTargetIdentity {
  readonly key: string
  readonly label: string
  /** What answers, said in the report after the client's note. */
  readonly server: string
}

const coordinatorIdentity: SdkTargetIdentity = {
  key: "coord-sdk",
  label: "coordinator, SDK (batched)",
  server:
    "The coordinator runs as `quota-coordinator serve` in its own process (Postgres store with group commit, on a database created for the bench run)."
}

export const makeSdkTarget = async (
  prefix: string,
  partitions: number,
  identity: SdkTargetIdentity = coordinatorIdentity
): Promise<Target> => {
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

  const step = (op: string, call: () => Promise<Result>): Promise<StepOutcome> =>
    errors.guard(async () => {
      const { status } = await call()
      const outcome = outcomeOf(op, status)
      if (outcome === undefined) errors.note(new Error(`${op}: ${status}`))
      return outcome ?? "error"
    })

  return {
    key: identity.key,
    label: identity.label,
    durable: true,
    supportsSlots: true,
    notes: [
      "`QuotaClient` from src/client: concurrent commands coalesced per partition into one NATS message (microtask batching), retries on unavailable/overloaded/timeout.",
      identity.server
    ],
    prime: (users) => inChunks(users, 1_000, (user) => step("get_usage", () => client.getUsage({ user }))),
    reserve: (hold) =>
      step("reserve", () =>
        client.reserve({ user: hold.user, meter: hold.meter, amount: hold.amount, id: hold.id })
      ),
    consume: (hold, amount, key) =>
      step("consume", () => client.consume({ user: hold.user, id: hold.id, amount, key })),
    commit: (hold, actual) =>
      step("commit", () => client.commit({ user: hold.user, id: hold.id, amount: actual })),
    release: (hold) => step("release", () => client.release({ user: hold.user, id: hold.id })),
    acquireSlot: (user, job) => step("acquire_slot", () => client.acquireSlot({ user, job })),
    releaseSlot: (user, job) => step("release_slot", () => client.releaseSlot({ user, job })),
    counters: () => {
      const counters = client.counters()
      return { requests: counters.commandsSent, messages: counters.messagesSent }
    },
    takeError,
    close: () => client.close()
  }
}
