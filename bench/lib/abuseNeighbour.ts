/**
 * The well-behaved neighbour of bench/abuse.ts, in its own process (forked with `--import tsx`), so the
 * abuser's own JSON building in the bench process does not count as the coordinator's stall: every
 * `intervalMs` it sends one command for one of its users (never the abuser), in turn `get_usage`,
 * `reserve` of a new id, `release` of that id, each a message of its own on the user's `.ops` subject,
 * and records the time from send to answer and the status. The answers it expects: `ok`, `reserved`,
 * `released`; anything else (`unavailable`, `overloaded`, a timeout) is a wrong answer.
 *
 * argv[2]: JSON `{ natsUrl, prefix, partitions, users, intervalMs }`. On the IPC message `"stop"` it
 * stops sending, waits for what is in flight, and sends back a `NeighbourReport`.
 */
import { monitorEventLoopDelay } from "node:perf_hooks"
import { connect } from "@nats-io/transport-node"
import { partitionOf } from "../../src/domain/partition.js"

export interface NeighbourSample {
  readonly op: string
  readonly status: string
  /** When the request was sent (epoch ms, Date.now()). */
  readonly sentAtMs: number
  readonly latencyMs: number
}

export interface NeighbourReport {
  readonly samples: ReadonlyArray<NeighbourSample>
  /** The neighbour process's own longest event-loop delay (ms): a bound on how late it noticed answers. */
  readonly ownLoopDelayMaxMs: number
}

interface NeighbourOptions {
  readonly natsUrl: string
  readonly prefix: string
  readonly partitions: number
  readonly users: ReadonlyArray<string>
  readonly intervalMs: number
}

const requestTimeoutMs = 5_000

const main = async () => {
  const options = JSON.parse(process.argv[2] ?? "{}") as NeighbourOptions
  const nc = await connect({ servers: options.natsUrl, name: "abuse-bench-neighbour" })
  const loop = monitorEventLoopDelay({ resolution: 10 })
  loop.enable()
  const samples: Array<NeighbourSample> = []
  const lastId = new Map<string, string>()
  const inFlight = new Set<Promise<void>>()
  let tick = 0
  let stopping = false

  const send = (user: string) => {
    const round = Math.floor(tick / options.users.length) % 3
    tick += 1
    let command: Record<string, unknown>
    if (round === 0) command = { op: "get_usage", user }
    else if (round === 1) {
      const id = `nb-${tick}`
      lastId.set(user, id)
      command = { op: "reserve", user, meter: "work", amount: 1, id, ttlMs: 600_000 }
    } else command = { op: "release", user, id: lastId.get(user) ?? "none" }
    const subject = `${options.prefix}.v1.${partitionOf(user, options.partitions)}.ops`
    const sentAt = performance.now()
    const sentAtEpoch = Date.now()
    const op = String(command["op"])
    const done = nc
      .request(subject, JSON.stringify(command), { timeout: requestTimeoutMs })
      .then(
        (reply) => {
          const code = reply.headers?.get("Nats-Service-Error-Code")
          if (code !== undefined && code !== "") return `service-error-${code}`
          return String(reply.json<{ status?: string }>().status)
        },
        (error: unknown) => (String(error).includes("TIMEOUT") ? "timeout" : `error: ${String(error)}`)
      )
      .then((status) => {
        samples.push({ op, status, sentAtMs: sentAtEpoch, latencyMs: performance.now() - sentAt })
      })
    inFlight.add(done)
    void done.finally(() => inFlight.delete(done))
  }

  // A fixed schedule: the next send is due intervalMs after the previous one was due, whatever the answers.
  let due = performance.now()
  const schedule = () => {
    if (stopping) return
    const user = options.users[tick % options.users.length]!
    send(user)
    due += options.intervalMs
    setTimeout(schedule, Math.max(0, due - performance.now()))
  }
  schedule()

  process.on("message", (message) => {
    if (message !== "stop") return
    stopping = true
    void (async () => {
      await Promise.allSettled([...inFlight])
      await nc.close()
      const report: NeighbourReport = { samples, ownLoopDelayMaxMs: loop.max / 1e6 }
      process.send?.(report, () => process.exit(0))
    })()
  })
  process.send?.("ready")
}

void main()
