/**
 * The coordinator over NATS, spoken directly on the wire (PROTOCOL.md): JSON commands to
 * `{prefix}.v1.{partition}.ops`. Two ways to send:
 *
 * - `message`: one command per NATS request.
 * - `coalesce`: the bench's own coalescer: commands issued in the same microtask turn are
 *   grouped per partition and sent as one batch message (at most 1 000 commands), as a client SDK
 *   that batches does. Used for the NATS echo ceiling (see echoServer.ts).
 *
 * With `echo: true` any reply counts as success: the far side is the echo server, not a coordinator.
 */
import { jetstreamManager } from "@nats-io/jetstream"
import { connect } from "@nats-io/transport-node"
import type { NatsConnection } from "@nats-io/transport-node"
import { defaultStreamName } from "../../src/config/eventSettings.js"
import { partitionOf } from "../../src/domain/partition.js"
import type { HoldRef, StepOutcome, Target } from "./Target.js"
import { inChunks, makeErrorNote } from "./Target.js"

export const natsUrl = process.env["BENCH_NATS_URL"] ?? "nats://127.0.0.1:4222"

/**
 * Deletes the events stream a coordinator with `prefix` created. JetStream reserves a stream's size
 * cap (1 GiB by default) for as long as the stream exists, so streams left behind by bench runs used
 * up the server's storage and new streams were refused. A stream already gone is fine.
 */
export const deleteEventsStream = async (prefix: string): Promise<void> => {
  const nc = await connect({ servers: natsUrl, name: "bench-cleanup" })
  try {
    const manager = await jetstreamManager(nc)
    await manager.streams.delete(defaultStreamName(prefix)).catch(() => false)
  } finally {
    await nc.close()
  }
}

/** Long enough for 4 096 requests queued behind one slow Postgres commit; a timeout counts as an error. */
export const requestTimeoutMs = 30_000

/** The protocol's batch limit. */
const batchCommandsMax = 1_000

export interface NatsTargetOptions {
  readonly key: string
  readonly label: string
  readonly notes: ReadonlyArray<string>
  readonly prefix: string
  readonly partitions: number
  readonly mode: "message" | "coalesce"
  readonly echo: boolean
}

type WireCommand = Record<string, unknown> & { readonly op: string; readonly user: string }
type WireResult = { readonly status?: string } & Record<string, unknown>

interface Pending {
  readonly command: WireCommand
  readonly resolve: (result: WireResult) => void
  readonly reject: (error: unknown) => void
}

/** Statuses that mean the step happened (`exists`: a retry found it done). */
const successStatuses: Readonly<Record<string, ReadonlyArray<string>>> = {
  reserve: ["reserved", "exists"],
  consume: ["consumed", "exists"],
  commit: ["committed", "exists"],
  release: ["released", "exists"],
  acquire_slot: ["acquired", "exists"],
  release_slot: ["released"],
  get_usage: ["ok"]
}

/** The outcome of the coordinator's answer `status` to `op`; undefined when it is neither (an error). */
export const outcomeOf = (op: string, status: string): StepOutcome | undefined =>
  successStatuses[op]?.includes(status) === true
    ? "ok"
    : status === "insufficient_quota" || status === "busy"
      ? "refused"
      : undefined

export const makeNatsTarget = async (options: NatsTargetOptions): Promise<Target> => {
  const nc: NatsConnection = await connect({ servers: natsUrl, name: `bench-${options.key}` })
  const errors = makeErrorNote()
  let requests = 0
  let messages = 0
  const subjectOf = (user: string) => `${options.prefix}.v1.${partitionOf(user, options.partitions)}.ops`

  const sendBatch = async (subject: string, batch: ReadonlyArray<Pending>): Promise<void> => {
    messages += 1
    try {
      const reply = await nc.request(subject, JSON.stringify(batch.map((entry) => entry.command)), {
        timeout: requestTimeoutMs
      })
      const results = reply.json<ReadonlyArray<WireResult>>()
      if (!Array.isArray(results) || results.length !== batch.length) {
        const reason =
          reply.headers?.get("Nats-Service-Error") ?? "reply is not an array of the batch's length"
        throw new Error(`batch reply: ${reason}`)
      }
      batch.forEach((entry, index) => entry.resolve(results[index]!))
    } catch (error) {
      for (const entry of batch) entry.reject(error)
    }
  }

  const queued = new Map<string, Array<Pending>>()
  let flushScheduled = false
  const flush = () => {
    flushScheduled = false
    const groups = [...queued]
    queued.clear()
    for (const [subject, entries] of groups) {
      for (let start = 0; start < entries.length; start += batchCommandsMax) {
        void sendBatch(subject, entries.slice(start, start + batchCommandsMax))
      }
    }
  }

  const send = (command: WireCommand): Promise<WireResult> => {
    requests += 1
    const subject = subjectOf(command.user)
    if (options.mode === "message") {
      messages += 1
      return nc
        .request(subject, JSON.stringify(command), { timeout: requestTimeoutMs })
        .then((reply) => reply.json<WireResult>())
    }
    return new Promise<WireResult>((resolve, reject) => {
      let entries = queued.get(subject)
      if (entries === undefined) {
        entries = []
        queued.set(subject, entries)
      }
      entries.push({ command, resolve, reject })
      if (!flushScheduled) {
        flushScheduled = true
        queueMicrotask(flush)
      }
    })
  }

  const step = (command: WireCommand): Promise<StepOutcome> =>
    errors.guard(async () => {
      const result = await send(command)
      if (options.echo) return "ok"
      const status = result.status ?? "(no status)"
      const outcome = outcomeOf(command.op, status)
      if (outcome !== undefined) return outcome
      const detail = typeof result["error"] === "string" ? ` (${result["error"]})` : ""
      errors.note(new Error(`${command.op}: ${status}${detail}`))
      return "error"
    })

  return {
    key: options.key,
    label: options.label,
    durable: !options.echo,
    supportsSlots: true,
    notes: options.notes,
    // Loads each user's actor: the runs measure a warm coordinator.
    prime: (users) => inChunks(options.echo ? [] : users, 64, (user) => step({ op: "get_usage", user })),
    reserve: (hold: HoldRef) =>
      step({ op: "reserve", user: hold.user, meter: hold.meter, amount: hold.amount, id: hold.id }),
    consume: (hold, amount, key) => step({ op: "consume", user: hold.user, id: hold.id, amount, key }),
    commit: (hold, actual) => step({ op: "commit", user: hold.user, id: hold.id, amount: actual }),
    release: (hold) => step({ op: "release", user: hold.user, id: hold.id }),
    acquireSlot: (user, job) => step({ op: "acquire_slot", user, job }),
    releaseSlot: (user, job) => step({ op: "release_slot", user, job }),
    counters: () => ({ requests, messages }),
    takeError: errors.take,
    close: async () => {
      await nc.drain()
    }
  }
}
