/**
 * One request, whatever carried it: parse the body, judge each command (shape, then partition), submit
 * the rest to the coordinator, and assemble the reply body, or the 400 service error a body that is not
 * a command or a batch gets (PROTOCOL.md "Messages"). The NATS server and the in-process transport both
 * call this, so they answer the same bytes for the same requests.
 *
 * `handle` enqueues every command into its partition's actor synchronously (`Coordinator.enqueueIn`,
 * with the partition the subject named, computed nowhere else): commands of one user are decided in
 * message order and, within a batch, in array order. Each result comes back through a callback and the
 * reply is assembled when the last one arrives; no fiber is made per message, and nothing here keeps
 * the request: the partition actor that holds its commands answers each exactly once, `unavailable`
 * when it is stopped. `done` is called exactly once; at once when nothing needs deciding. A defect while
 * enqueuing answers the message's remaining commands `unavailable`: never silence.
 *
 * The reply is bounded as it is built: each result is encoded when it arrives, and once the encoded
 * results pass `replyBytesMax` (the server's max payload) the rest are counted but not kept, and the
 * request is answered with the 400 service error: a batch of reads of megabytes is never held whole.
 */
import { Effect } from "effect"
import type { Scope } from "effect"
import { Coordinator } from "../actors/Coordinator.js"
import type { Command, ListUsageCommand } from "../domain/commands.js"
import { messageBytesMax } from "../domain/limits.js"
import type { Result, Status } from "../domain/results.js"
import { unavailable } from "../domain/results.js"
import { parseBody } from "./body.js"
import type { Judged, SubjectKind } from "./decode.js"
import { judgeCommand } from "./decode.js"
import { reasonOf } from "./errors.js"
import type { Logger } from "./log.js"
import { logDecision, logRefusal } from "./log.js"
import type { MetricsRecorder } from "../ops/MetricsRecorder.js"
import { noMetrics } from "../ops/MetricsRecorder.js"

/** Where a request arrived: its subject (for logs), the kind of subject, and its partition. */
export interface RequestTarget {
  readonly subject: string
  readonly kind: SubjectKind
  readonly partition: number
}

/**
 * The answer to one request: a body (one result or an array of them), with `failure` naming why some
 * commands were answered `unavailable` (for the endpoint's error counters); or a service error, sent as
 * an empty body with the headers `Nats-Service-Error-Code` and `Nats-Service-Error`.
 */
export type Handled =
  | { readonly body: string; readonly bytes: number; readonly failure?: string }
  | { readonly error: { readonly code: number; readonly reason: string } }

/** A result as it goes on the wire: with the command's `ref` when it had a valid one. */
export type WireResult = Result & { readonly ref?: string }

export interface RequestHandlerOptions {
  readonly logger: Logger
  /** P, the deployment's partition count, for the partition check. */
  readonly partitions: number
  /** Largest request body (default 1 MiB, as the protocol says). */
  readonly messageBytesMax?: number
  /** Counts every answered command and its receipt-to-reply time (default: metrics off). */
  readonly metrics?: MetricsRecorder
  /**
   * Largest reply body: the NATS server's max payload, read when a reply is built (default 1 MiB).
   * A reply that would be larger is not built; the request gets the 400 service error instead.
   */
  readonly replyBytesMax?: () => number
}

export interface RequestHandler {
  /** Judges and enqueues synchronously, then calls `done` once with the answer. */
  readonly handle: (target: RequestTarget, data: Uint8Array, done: (handled: Handled) => void) => void
  /** `handle` as a promise; the commands are enqueued before it returns. */
  readonly request: (target: RequestTarget, data: Uint8Array) => Promise<Handled>
}

/** A judged command, or `unavailable` when judging it hit a bug. */
type Judgement = Judged | { readonly answer: Result; readonly ref: undefined }

const withRef = (result: Result, ref: string | undefined): WireResult =>
  ref === undefined ? result : { ...result, ref }

/** The op a refused command named, for its metric label (the recorder maps any other to `unknown`). */
const rawOp = (raw: unknown): string => {
  const op = typeof raw === "object" && raw !== null ? (raw as { op?: unknown }).op : undefined
  return typeof op === "string" ? op : "unknown"
}

export const makeRequestHandler = (
  options: RequestHandlerOptions
): Effect.Effect<RequestHandler, never, Coordinator | Scope.Scope> =>
  Effect.gen(function* () {
    const coordinator = yield* Coordinator
    const { logger, partitions } = options
    const metrics = options.metrics ?? noMetrics
    const replyBytesMax = options.replyBytesMax ?? (() => messageBytesMax)

    /** Decode and partition check, with a bug in them costing one command `unavailable`, not the message. */
    const judgeSafely = (raw: unknown, target: RequestTarget): Judgement => {
      try {
        return judgeCommand(raw, target.kind, target.partition, partitions)
      } catch (cause) {
        logger.error({ error: reasonOf(cause) }, "decode defect")
        return { answer: unavailable, ref: undefined }
      }
    }

    const handle = (target: RequestTarget, data: Uint8Array, done: (handled: Handled) => void): void => {
      const receivedAt = metrics === noMetrics ? 0 : performance.now()
      const body = parseBody(data, options.messageBytesMax)
      if (body.kind === "refused") {
        logger.warn({ subject: target.subject, reason: body.reason }, "request refused")
        return done({ error: { code: 400, reason: body.reason } })
      }
      const raws = body.kind === "single" ? [body.command] : body.commands
      /** Each command's status once answered (for metrics); undefined while it is being decided. */
      const statuses: Array<Status | undefined> = new Array<Status | undefined>(raws.length)
      /** Each answered command's result as JSON, while the reply stays within replyBytesMax. */
      const encoded: Array<string | undefined> = new Array<string | undefined>(raws.length)
      const commands: Array<Command | ListUsageCommand | undefined> = new Array<
        Command | ListUsageCommand | undefined
      >(raws.length)
      const refs: Array<string | undefined> = new Array<string | undefined>(raws.length)
      const bytesMax = replyBytesMax()
      /** The reply's bytes so far: the encoded results, a comma or bracket each, and the closing bracket. */
      let replyBytes = 1
      let replyTooLarge = false
      const record = (index: number, result: Result): void => {
        statuses[index] = result.status
        if (replyTooLarge) return
        const part = JSON.stringify(withRef(result, refs[index]))
        replyBytes += Buffer.byteLength(part) + 1
        if (replyBytes > bytesMax) {
          replyTooLarge = true
          encoded.fill(undefined)
        } else encoded[index] = part
      }
      let undecided = 0
      for (let index = 0; index < raws.length; index += 1) {
        const judged = judgeSafely(raws[index], target)
        refs[index] = judged.ref
        if ("answer" in judged) {
          record(index, judged.answer)
          logRefusal(logger, target.subject, judged.answer, judged.ref)
        } else {
          commands[index] = "submit" in judged ? judged.submit : judged.listUsage
          undecided += 1
        }
      }
      const reply = (failure?: string) => {
        if (metrics !== noMetrics) {
          const seconds = (performance.now() - receivedAt) / 1_000
          for (let index = 0; index < raws.length; index += 1) {
            const op = commands[index]?.op ?? rawOp(raws[index])
            metrics.commandAnswered(op, statuses[index]!, seconds)
          }
        }
        if (replyTooLarge) {
          // Decided all the same: a retry of the same ids, fewer per message, says what stands.
          const reason = `reply larger than the max payload of ${bytesMax} bytes; the commands were decided: send fewer per message`
          logger.warn({ subject: target.subject, commands: raws.length, bytesMax }, "reply too large")
          return done({ error: { code: 400, reason } })
        }
        const text = body.kind === "single" ? encoded[0]! : `[${encoded.join(",")}]`
        // A single result has no brackets: its bytes are one fewer than counted.
        const bytes = body.kind === "single" ? replyBytes - 2 : replyBytes
        done(failure === undefined ? { body: text, bytes } : { body: text, bytes, failure })
      }
      if (undecided === 0) return reply()

      let answered = false
      const finish = (failure?: string): void => {
        answered = true
        reply(failure)
      }
      /** A command's result; the last one sends the reply. Late results (after answerRest) are dropped. */
      const settle = (index: number, result: Result): void => {
        if (answered || statuses[index] !== undefined) return
        record(index, result)
        logDecision(logger, commands[index]!, result, refs[index])
        undecided -= 1
        if (undecided === 0) finish()
      }
      /** Answers every command without a result `unavailable`, and the request with `failure`. */
      const answerRest = (failure: string): void => {
        if (answered) return
        logger.error({ subject: target.subject, undecided }, failure)
        for (let index = 0; index < raws.length; index += 1) {
          if (statuses[index] !== undefined) continue
          record(index, unavailable)
          logDecision(logger, commands[index]!, unavailable, refs[index])
        }
        finish(failure)
      }

      for (let index = 0; index < raws.length; index += 1) {
        const command = commands[index]
        if (command === undefined) continue
        try {
          if (command.op === "list_usage") coordinator.listUsage(command, (result) => settle(index, result))
          else coordinator.enqueueIn(target.partition, command, (result) => settle(index, result))
        } catch (cause) {
          logger.error({ subject: target.subject, error: reasonOf(cause) }, "enqueue failed")
          return answerRest("coordinator defect")
        }
      }
    }

    const request = (target: RequestTarget, data: Uint8Array): Promise<Handled> =>
      new Promise<Handled>((resolve) => handle(target, data, resolve))

    return { handle, request }
  })
