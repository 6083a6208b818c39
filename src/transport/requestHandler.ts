/**
 * One request, whatever carried it: parse the body, judge each command (shape, then partition), submit
 * the rest to the coordinator, and assemble the reply body, or the 400 service error a body that is not
 * a command or a batch gets (PROTOCOL.md "Messages"). The NATS server and the in-process transport both
 * call this, so they answer the same bytes for the same requests.
 *
 * `handle` runs synchronously up to the point where the commands are enqueued into their users'
 * mailboxes (`Coordinator.submitAll` enqueues before it first suspends): commands of one user are
 * decided in message order and, within a batch, in array order. `done` is called exactly once; at once
 * when nothing needs deciding. Whatever goes wrong after submission (a defect, an interruption at
 * shutdown) answers the affected commands `unavailable`: never silence.
 */
import { Cause, Effect, Exit, FiberSet } from "effect"
import type { Scope } from "effect"
import { Coordinator } from "../actors/Coordinator.js"
import type { Command } from "../domain/commands.js"
import type { Result } from "../domain/results.js"
import { unavailable } from "../domain/results.js"
import { parseBody } from "./body.js"
import type { Judged, SubjectKind } from "./decode.js"
import { judgeCommand } from "./decode.js"
import { reasonOf } from "./errors.js"
import { InFlight } from "./inFlight.js"
import type { Logger } from "./log.js"
import { logDecision, logRefusal } from "./log.js"

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
  | { readonly body: string; readonly failure?: string }
  | { readonly error: { readonly code: number; readonly reason: string } }

/** A result as it goes on the wire: with the command's `ref` when it had a valid one. */
export type WireResult = Result & { readonly ref?: string }

export interface RequestHandlerOptions {
  readonly logger: Logger
  /** P, the deployment's partition count, for the partition check. */
  readonly partitions: number
  /** Largest request body (default 1 MiB, as the protocol says). */
  readonly messageBytesMax?: number
}

export interface RequestHandler {
  /** Judges and enqueues synchronously, then calls `done` once with the answer. */
  readonly handle: (target: RequestTarget, data: Uint8Array, done: (handled: Handled) => void) => void
  /** `handle` as a promise; the commands are enqueued before it returns. */
  readonly request: (target: RequestTarget, data: Uint8Array) => Promise<Handled>
  /** Requests submitted and not yet answered, per partition. */
  readonly inFlight: InFlight
  /** Interrupts every request still being decided; their observers answer them `unavailable`. */
  readonly interruptAll: Effect.Effect<void>
}

/** A judged command, or `unavailable` when judging it hit a bug. */
type Judgement = Judged | { readonly answer: Result; readonly ref: undefined }

const withRef = (result: Result, ref: string | undefined): WireResult =>
  ref === undefined ? result : { ...result, ref }

export const makeRequestHandler = (
  options: RequestHandlerOptions
): Effect.Effect<RequestHandler, never, Coordinator | Scope.Scope> =>
  Effect.gen(function* () {
    const coordinator = yield* Coordinator
    const fibers = yield* FiberSet.make<ReadonlyArray<Result>>()
    const runTracked = yield* FiberSet.runtime(fibers)<never>()
    const inFlight = new InFlight()
    const { logger, partitions } = options

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
      const body = parseBody(data, options.messageBytesMax)
      if (body.kind === "refused") {
        logger.warn({ subject: target.subject, reason: body.reason }, "request refused")
        return done({ error: { code: 400, reason: body.reason } })
      }
      const raws = body.kind === "single" ? [body.command] : body.commands
      const results: Array<WireResult> = new Array<WireResult>(raws.length)
      const submitted: Array<Command> = []
      const submittedAt: Array<number> = []
      const refs: Array<string | undefined> = new Array<string | undefined>(raws.length)
      for (let index = 0; index < raws.length; index += 1) {
        const judged = judgeSafely(raws[index], target)
        refs[index] = judged.ref
        if ("answer" in judged) {
          results[index] = withRef(judged.answer, judged.ref)
          logRefusal(logger, target.subject, judged.answer, judged.ref)
        } else {
          submitted.push(judged.submit)
          submittedAt.push(index)
        }
      }
      const reply = (failure?: string) => {
        const text = JSON.stringify(body.kind === "single" ? results[0] : results)
        done(failure === undefined ? { body: text } : { body: text, failure })
      }
      if (submitted.length === 0) return reply()

      inFlight.begin(target.partition)
      // Runs synchronously up to the first suspension: every command is in its mailbox when this returns.
      const fiber = runTracked(coordinator.submitAll(submitted))
      fiber.addObserver((exit) => {
        let failure: string | undefined
        if (Exit.isFailure(exit)) {
          failure = Cause.hasInterruptsOnly(exit.cause) ? "interrupted" : "coordinator defect"
          logger.error({ subject: target.subject, cause: Cause.pretty(exit.cause) }, failure)
        }
        const decided = Exit.isSuccess(exit) ? exit.value : []
        for (let position = 0; position < submitted.length; position += 1) {
          const index = submittedAt[position] as number
          const command = submitted[position] as Command
          const result = decided[position] ?? unavailable
          results[index] = withRef(result, refs[index])
          logDecision(logger, command, result, refs[index])
        }
        reply(failure)
        inFlight.end(target.partition)
      })
    }

    const request = (target: RequestTarget, data: Uint8Array): Promise<Handled> =>
      new Promise<Handled>((resolve) => handle(target, data, resolve))

    return { handle, request, inFlight, interruptAll: FiberSet.clear(fibers) }
  })
