/**
 * Sends commands to the coordinator, coalesced into batch messages, and retries what the protocol
 * says is safe to retry.
 *
 * Coalescing: each subject (one partition's `.ops` or `.admin`) has a lane. When nothing is in flight
 * on the lane, queued commands go out at the end of the current microtask, so commands issued in the
 * same tick share a message. While a message is in flight the next batch accumulates and goes when it
 * returns; a batch that reaches `batchCommandsMax` commands (or the message size limit) goes at once,
 * in flight or not. Replies are arrays in request order: results are matched by position.
 *
 * Retries: `unavailable` and `overloaded` results, no responders and timeouts put the command back in
 * its lane after a capped exponential backoff with jitter. The command is re-sent byte for byte, so
 * its `id`/`job`/`key` is the same and the coordinator answers a repeat with `exists` rather than
 * granting twice. Everything else is an answer (`busy` and `limit_reached` included: a per-user bound
 * answers the same until the caller frees something) or a failure that retrying cannot fix.
 */
import { TimeoutError } from "@nats-io/transport-node"
import type { Msg, NatsConnection } from "@nats-io/transport-node"
import type { Result } from "../domain/results.js"
import type { CommandNames, QuotaClientError, RetryReason } from "./errors.js"
import {
  namesOf,
  QuotaClientClosed,
  QuotaRetriesExhausted,
  QuotaServiceError,
  QuotaTransportError
} from "./errors.js"
import type { ResolvedOptions } from "./options.js"
import { retryDelayMs } from "./options.js"

/** Counts since the client was made, for tests and benchmarks. */
export interface ClientCounters {
  /** Request messages published, retries included. */
  readonly messagesSent: number
  /** Commands carried by those messages, retries included. */
  readonly commandsSent: number
  /** Commands put back for another attempt. */
  readonly retries: number
}

/** A command on its way: encoded once, re-sent unchanged on every attempt. */
interface PendingCommand {
  readonly op: string
  /** Its user and id/job/key, for the errors it may fail with. */
  readonly names: CommandNames
  readonly subject: string
  readonly json: string
  readonly bytes: number
  /**
   * Sent in a message of its own, never coalesced: an `acquire_slot` that waits holds back its whole
   * batch's reply (PROTOCOL.md), so it must not delay other callers' commands.
   */
  readonly alone: boolean
  /** The reply timeout of a message carrying this command. */
  readonly timeoutMs: number
  attempts: number
  /** `performance.now()` at the first send. */
  firstSentAtMs: number
  /** Answered, failed or abandoned: no further attempt is made. */
  settled: boolean
  readonly resolve: (result: Result) => void
  readonly reject: (error: QuotaClientError | CommandAbandoned) => void
}

/**
 * What `submit` rejects with when its `signal` aborts: the command is withdrawn from the dispatcher
 * (dropped from its queue or backoff, never re-sent), though a copy already sent may still be decided.
 */
export class CommandAbandoned {
  constructor(readonly reason: unknown) {}
}

interface Lane {
  readonly subject: string
  queued: Array<PendingCommand>
  queuedBytes: number
  /** Messages of this lane sent and not yet answered. */
  messagesInFlight: number
  flushScheduled: boolean
}

const serviceErrorCodeHeader = "Nats-Service-Error-Code"
const serviceErrorHeader = "Nats-Service-Error"

/** Bytes of the brackets and separators a batch adds around its commands. */
const batchOverheadBytes = 2

const isResult = (value: unknown): value is Result =>
  typeof value === "object" && value !== null && typeof (value as { status?: unknown }).status === "string"

const isNoResponders = (error: unknown): boolean =>
  error instanceof Error && "isNoResponders" in error && typeof error.isNoResponders === "function"
    ? error.isNoResponders() === true
    : false

const reasonOf = (error: unknown): string => (error instanceof Error ? error.message : String(error))

export class CommandDispatcher {
  private readonly lanes = new Map<string, Lane>()
  /** Settles when the message's reply is handled; `close` waits for all of them. */
  private readonly messagesInFlight = new Set<Promise<void>>()
  /** Commands waiting out a backoff, by their timer. */
  private readonly retriesWaiting = new Map<ReturnType<typeof setTimeout>, ReadonlyArray<PendingCommand>>()
  private readonly messageBytesMax: number
  private closed = false
  private messagesSent = 0
  private commandsSent = 0
  private retries = 0

  constructor(
    private readonly nc: NatsConnection,
    private readonly options: ResolvedOptions
  ) {
    // A server configured below the protocol's 1 MiB would refuse our largest batches outright.
    const serverPayloadMax = nc.info?.max_payload
    this.messageBytesMax =
      serverPayloadMax !== undefined && serverPayloadMax > 0
        ? Math.min(serverPayloadMax, options.messageBytesMax)
        : options.messageBytesMax
  }

  /**
   * Sends one command to `subject` and resolves with its result. Rejects only with a
   * `QuotaClientError`. `extraTimeoutMs` is added to the reply timeout (an `acquire_slot`'s wait);
   * a command with extra time is sent alone. When `signal` aborts before the result, the command gets
   * no further attempt and the promise rejects with `CommandAbandoned`.
   */
  submit(
    subject: string,
    command: { readonly op: string },
    extraTimeoutMs = 0,
    signal?: AbortSignal
  ): Promise<Result> {
    if (this.closed) return Promise.reject(new QuotaClientClosed({ op: command.op, ...namesOf(command) }))
    const json = JSON.stringify(command)
    return new Promise<Result>((resolve, reject) => {
      const onAbort = () => pending.reject(new CommandAbandoned(signal?.reason))
      const pending: PendingCommand = {
        op: command.op,
        names: namesOf(command),
        subject,
        json,
        bytes: Buffer.byteLength(json),
        alone: extraTimeoutMs > 0,
        timeoutMs: this.options.timeoutMs + extraTimeoutMs,
        attempts: 0,
        firstSentAtMs: 0,
        settled: false,
        resolve: (result) => {
          pending.settled = true
          signal?.removeEventListener("abort", onAbort)
          resolve(result)
        },
        reject: (error) => {
          pending.settled = true
          signal?.removeEventListener("abort", onAbort)
          reject(error)
        }
      }
      signal?.addEventListener("abort", onAbort, { once: true })
      this.enqueue(pending)
    })
  }

  counters(): ClientCounters {
    return { messagesSent: this.messagesSent, commandsSent: this.commandsSent, retries: this.retries }
  }

  /**
   * Stops taking commands: those queued or waiting to be retried fail with `QuotaClientClosed`;
   * resolves when every message in flight is answered or timed out.
   */
  async close(): Promise<void> {
    this.closed = true
    for (const lane of this.lanes.values()) {
      const queued = lane.queued
      lane.queued = []
      lane.queuedBytes = 0
      for (const command of queued) command.reject(this.closedError(command))
    }
    for (const [timer, commands] of this.retriesWaiting) {
      clearTimeout(timer)
      for (const command of commands) command.reject(this.closedError(command))
    }
    this.retriesWaiting.clear()
    await Promise.allSettled([...this.messagesInFlight])
  }

  private enqueue(command: PendingCommand): void {
    if (command.alone) {
      this.send(command.subject, [command], undefined)
      return
    }
    const lane = this.laneOf(command.subject)
    const fits =
      lane.queued.length < this.options.batchCommandsMax &&
      lane.queuedBytes + command.bytes + 1 + batchOverheadBytes <= this.messageBytesMax
    // The batch is full: it goes now, whatever is in flight, and this command starts the next one.
    if (!fits && lane.queued.length > 0) this.sendQueued(lane)
    lane.queued.push(command)
    lane.queuedBytes += command.bytes + 1
    if (lane.queued.length >= this.options.batchCommandsMax) this.sendQueued(lane)
    else if (lane.messagesInFlight === 0) this.scheduleFlush(lane)
  }

  private laneOf(subject: string): Lane {
    let lane = this.lanes.get(subject)
    if (lane === undefined) {
      lane = { subject, queued: [], queuedBytes: 0, messagesInFlight: 0, flushScheduled: false }
      this.lanes.set(subject, lane)
    }
    return lane
  }

  /** Sends what is queued at the end of this microtask, so a burst of calls shares one message. */
  private scheduleFlush(lane: Lane): void {
    if (lane.flushScheduled) return
    lane.flushScheduled = true
    queueMicrotask(() => {
      lane.flushScheduled = false
      if (lane.messagesInFlight === 0 && lane.queued.length > 0) this.sendQueued(lane)
    })
  }

  private sendQueued(lane: Lane): void {
    const batch = lane.queued.filter((command) => !command.settled)
    lane.queued = []
    lane.queuedBytes = 0
    if (batch.length > 0) this.send(lane.subject, batch, lane)
  }

  private send(subject: string, batch: ReadonlyArray<PendingCommand>, lane: Lane | undefined): void {
    const body =
      batch.length === 1 ? `[${batch[0]!.json}]` : `[${batch.map((command) => command.json).join(",")}]`
    let timeoutMs = 0
    for (const command of batch) {
      if (command.attempts === 0) command.firstSentAtMs = performance.now()
      command.attempts += 1
      timeoutMs = Math.max(timeoutMs, command.timeoutMs)
    }
    this.messagesSent += 1
    this.commandsSent += batch.length
    if (lane !== undefined) lane.messagesInFlight += 1
    let request: Promise<Msg>
    try {
      request = this.nc.request(subject, body, { timeout: timeoutMs })
    } catch (error) {
      request = Promise.reject(error)
    }
    const handled = request
      .then(
        (reply) => this.handleReply(subject, batch, reply),
        (error: unknown) => this.handleFailure(subject, batch, error)
      )
      .catch((bug: unknown) => {
        // A bug in reply handling must not leave callers waiting forever; settled ones ignore this.
        this.rejectAll(batch, (command) => this.transportError(command, `client bug: ${reasonOf(bug)}`, bug))
      })
      .finally(() => {
        this.messagesInFlight.delete(handled)
        if (lane === undefined) return
        lane.messagesInFlight -= 1
        if (lane.messagesInFlight === 0 && lane.queued.length > 0) this.scheduleFlush(lane)
      })
    this.messagesInFlight.add(handled)
  }

  private handleReply(subject: string, batch: ReadonlyArray<PendingCommand>, reply: Msg): void {
    const code = reply.headers?.get(serviceErrorCodeHeader)
    if (code !== undefined && code !== "") {
      const description = reply.headers?.get(serviceErrorHeader) ?? ""
      this.rejectAll(
        batch,
        (command) =>
          new QuotaServiceError({
            ...command.names,
            subject,
            op: command.op,
            code: Number(code),
            description
          })
      )
      return
    }
    let results: unknown
    try {
      results = reply.json()
    } catch (error) {
      this.rejectAll(batch, (command) => this.transportError(command, "reply is not JSON", error))
      return
    }
    if (!Array.isArray(results) || results.length !== batch.length) {
      const reason = `reply is not an array of ${batch.length} results`
      this.rejectAll(batch, (command) => this.transportError(command, reason))
      return
    }
    const retryable: Array<PendingCommand> = []
    let retryReason: RetryReason = "unavailable"
    batch.forEach((command, index) => {
      const result: unknown = results[index]
      if (!isResult(result)) {
        command.reject(this.transportError(command, `result ${index} has no status`))
      } else if (result.status === "unavailable" || result.status === "overloaded") {
        retryable.push(command)
        retryReason = result.status
      } else {
        command.resolve(result)
      }
    })
    if (retryable.length > 0) this.retryLater(subject, retryable, retryReason)
  }

  private handleFailure(subject: string, batch: ReadonlyArray<PendingCommand>, error: unknown): void {
    if (isNoResponders(error)) this.retryLater(subject, batch, "no_responders")
    else if (error instanceof TimeoutError) this.retryLater(subject, batch, "timeout")
    else this.rejectAll(batch, (command) => this.transportError(command, reasonOf(error), error))
  }

  private rejectAll(
    batch: ReadonlyArray<PendingCommand>,
    errorOf: (command: PendingCommand) => QuotaClientError
  ): void {
    for (const command of batch) command.reject(errorOf(command))
  }

  private closedError(command: PendingCommand): QuotaClientClosed {
    return new QuotaClientClosed({ op: command.op, ...command.names })
  }

  private transportError(command: PendingCommand, reason: string, cause?: unknown): QuotaTransportError {
    return new QuotaTransportError({
      ...command.names,
      subject: command.subject,
      op: command.op,
      reason,
      cause
    })
  }

  /**
   * Fails the commands out of attempts; puts the others back in their lanes after one shared backoff,
   * so a batch that failed together is retried together and stays coalesced.
   */
  private retryLater(subject: string, batch: ReadonlyArray<PendingCommand>, reason: RetryReason): void {
    const again: Array<PendingCommand> = []
    let attemptsMost = 0
    for (const command of batch) {
      if (command.settled) {
        // Abandoned while in flight: not retried.
      } else if (this.closed) {
        command.reject(this.closedError(command))
      } else if (command.attempts >= this.options.retry.attemptsMax) {
        command.reject(
          new QuotaRetriesExhausted({
            ...command.names,
            subject,
            op: command.op,
            attempts: command.attempts,
            reason,
            elapsedMs: performance.now() - command.firstSentAtMs
          })
        )
      } else {
        again.push(command)
        attemptsMost = Math.max(attemptsMost, command.attempts)
      }
    }
    if (again.length === 0) return
    this.retries += again.length
    const timer = setTimeout(
      () => {
        this.retriesWaiting.delete(timer)
        for (const command of again) if (!command.settled) this.enqueue(command)
      },
      retryDelayMs(attemptsMost, this.options.retry, this.options.random)
    )
    this.retriesWaiting.set(timer, again)
  }
}
