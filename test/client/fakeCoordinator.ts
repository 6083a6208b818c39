/**
 * A stand-in coordinator for the client's own tests: it subscribes `{prefix}.v1.*.ops|admin` on the real
 * nats-server, records every message it receives, and answers each command from a small model of holds
 * and slots, or from a test's override. It checks routing the way the real one does (`wrong_partition`
 * when a user does not hash to the subject's partition), so a client that misroutes fails the tests.
 */
import { randomUUID } from "node:crypto"
import { connect, headers } from "@nats-io/transport-node"
import type { Msg, NatsConnection, Subscription } from "@nats-io/transport-node"
import { partitionOf } from "../../src/domain/partition.js"

export const natsUrl = "nats://127.0.0.1:4222"

/** Unique per test file and run, so parallel files never share subjects. */
export const randomPrefix = (label: string): string => `qc${label}${randomUUID().slice(0, 8)}`

/** `user` is absent only on `list_usage`, which names no user. */
export type Command = Record<string, unknown> & { readonly op: string; readonly user: string }
export type Answer = Record<string, unknown> & { readonly status: string }

export interface ReceivedMessage {
  readonly subject: string
  readonly kind: string
  readonly partition: number
  readonly commands: ReadonlyArray<Command>
  /** The raw body, to prove retries resend the same bytes. */
  readonly body: string
}

/** A test's say over one message: reply as usual, refuse it with a service error, or stay silent. */
export type MessageVerdict =
  "answer" | "silent" | { readonly serviceErrorCode: number; readonly reason: string }

export interface FakeCoordinatorOptions {
  readonly prefix: string
  readonly partitions: number
  /** Answer one command; return undefined to let the model answer. */
  readonly answer?: (command: Command, fake: FakeCoordinator) => Answer | undefined
  readonly verdict?: (message: ReceivedMessage, fake: FakeCoordinator) => MessageVerdict
  /** Delay before each reply, so the client has a message in flight long enough to coalesce. */
  readonly replyDelayMs?: (message: ReceivedMessage) => number
}

interface ModelHold {
  readonly meter: string
  readonly amount: number
  state: "pending" | "committed" | "released"
  committedAmount?: number
}

/** Limit of every meter in the model. */
export const modelLimit = 1_000

export class FakeCoordinator {
  readonly received: Array<ReceivedMessage> = []
  /** Model state: holds by `user/id`, usage by `user/meter`, slot jobs by user. */
  readonly holds = new Map<string, ModelHold>()
  readonly used = new Map<string, number>()
  readonly slots = new Map<string, Set<string>>()
  private subscriptions: Array<Subscription> = []

  private constructor(
    readonly nc: NatsConnection,
    readonly options: FakeCoordinatorOptions
  ) {}

  static async start(options: FakeCoordinatorOptions): Promise<FakeCoordinator> {
    const fake = new FakeCoordinator(await connect({ servers: natsUrl }), options)
    await fake.subscribe()
    return fake
  }

  /** Subscribes (again); resolves once the server has the subscriptions, so requests find them. */
  async subscribe(): Promise<void> {
    for (const kind of ["ops", "admin"]) {
      this.subscriptions.push(
        this.nc.subscribe(`${this.options.prefix}.v1.*.${kind}`, {
          callback: (_error, msg) => this.onMessage(msg)
        })
      )
    }
    await this.nc.flush()
  }

  /** Unsubscribes: requests then get no responders until `subscribe` is called again. */
  async unsubscribe(): Promise<void> {
    for (const subscription of this.subscriptions) subscription.unsubscribe()
    this.subscriptions = []
    await this.nc.flush()
  }

  async stop(): Promise<void> {
    await this.nc.close()
  }

  commandsReceived(): Array<Command> {
    return this.received.flatMap((message) => message.commands)
  }

  private onMessage(msg: Msg): void {
    const [, , partitionToken, kind] = msg.subject.split(".")
    const body = msg.string()
    const parsed = JSON.parse(body) as Command | Array<Command>
    const message: ReceivedMessage = {
      subject: msg.subject,
      kind: kind ?? "",
      partition: Number(partitionToken),
      commands: Array.isArray(parsed) ? parsed : [parsed],
      body
    }
    this.received.push(message)
    const verdict = this.options.verdict?.(message, this) ?? "answer"
    if (verdict === "silent") return
    const reply = () => {
      if (verdict === "answer") {
        const results = message.commands.map((command) => this.answerOne(command, message))
        msg.respond(JSON.stringify(Array.isArray(parsed) ? results : results[0]))
      } else {
        const hdrs = headers()
        hdrs.set("Nats-Service-Error-Code", String(verdict.serviceErrorCode))
        hdrs.set("Nats-Service-Error", verdict.reason)
        msg.respond(new Uint8Array(0), { headers: hdrs })
      }
    }
    const delayMs = this.options.replyDelayMs?.(message) ?? 0
    if (delayMs > 0) setTimeout(reply, delayMs)
    else reply()
  }

  private answerOne(command: Command, message: ReceivedMessage): Answer {
    const answer = this.decide(command, message)
    return command.ref === undefined ? answer : { ...answer, ref: command.ref }
  }

  private decide(command: Command, message: ReceivedMessage): Answer {
    // list_usage (revision 1.3) has no user: the subject names the partition it lists.
    if (
      command.op !== "list_usage" &&
      partitionOf(command.user, this.options.partitions) !== message.partition
    )
      return { status: "wrong_partition" }
    const adminOps = ["set_plan", "set_limit", "get_usage", "usage_history", "list_usage"]
    if (message.kind === "admin" && !adminOps.includes(command.op)) {
      return { status: "invalid_request", error: `op: ${command.op} is not an admin operation` }
    }
    return this.options.answer?.(command, this) ?? this.model(command)
  }

  /** Just enough of PROTOCOL.md's semantics for the helpers: holds against one limit, and slots. */
  private model(command: Command): Answer {
    const { user, op } = command
    const holdKey = `${user}/${String(command.id)}`
    const hold = this.holds.get(holdKey)
    switch (op) {
      case "reserve": {
        const meter = String(command.meter)
        const amount = Number(command.amount)
        if (hold !== undefined)
          return { status: hold.state === "pending" ? "exists" : "closed", id: command.id }
        const used = this.used.get(`${user}/${meter}`) ?? 0
        const reserved = [...this.holds.entries()]
          .filter(([key, h]) => key.startsWith(`${user}/`) && h.meter === meter && h.state === "pending")
          .reduce((sum, [, h]) => sum + h.amount, 0)
        if (used + reserved + amount > modelLimit) {
          return { status: "insufficient_quota", meter, requested: amount, used, reserved, limit: modelLimit }
        }
        this.holds.set(holdKey, { meter, amount, state: "pending" })
        return {
          status: "reserved",
          id: command.id,
          meter,
          amount,
          state: "pending",
          reserved: reserved + amount
        }
      }
      case "commit": {
        if (hold === undefined) return { status: "not_found" }
        if (hold.state !== "pending") return { status: hold.state === "committed" ? "exists" : "closed" }
        const amount = command.amount === undefined ? hold.amount : Number(command.amount)
        hold.state = "committed"
        hold.committedAmount = amount
        const meterKey = `${user}/${hold.meter}`
        this.used.set(meterKey, (this.used.get(meterKey) ?? 0) + amount)
        return { status: "committed", id: command.id, consumed: amount, state: "committed" }
      }
      case "release": {
        if (hold === undefined) return { status: "not_found" }
        if (hold.state !== "pending") return { status: hold.state === "released" ? "exists" : "closed" }
        hold.state = "released"
        return { status: "released", id: command.id, state: "released" }
      }
      case "acquire_slot": {
        const jobs = this.slots.get(user) ?? new Set<string>()
        this.slots.set(user, jobs)
        const job = String(command.job)
        if (jobs.has(job)) return { status: "exists", limit: 1, held: jobs.size, leaseExpiresAt: Date.now() }
        if (jobs.size >= 1) return { status: "busy", limit: 1, held: jobs.size, retryAfterMs: 30_000 }
        jobs.add(job)
        return { status: "acquired", limit: 1, held: jobs.size, leaseExpiresAt: Date.now() }
      }
      case "renew_slot":
      case "release_slot": {
        const jobs = this.slots.get(user)
        const job = String(command.job)
        if (jobs === undefined || !jobs.has(job))
          return { status: "not_found", limit: 1, held: jobs?.size ?? 0 }
        if (op === "release_slot") jobs.delete(job)
        return { status: op === "renew_slot" ? "renewed" : "released", limit: 1, held: jobs.size }
      }
      default:
        return { status: "ok" }
    }
  }
}
