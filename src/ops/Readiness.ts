/**
 * Readiness (`GET /readyz`): connected to NATS and Postgres answering. NATS's state is read from the
 * connection when asked; Postgres is asked every `readinessCheckIntervalMs` by a fiber of the serve
 * scope (one `select 1`, bounded by `readinessCheckTimeoutMs`), so a probe never waits on the
 * database and an outage shows within about interval + timeout, and its end as soon after.
 */
import { Duration, Effect } from "effect"
import type { Scope } from "effect"
import { readinessCheckIntervalMs, readinessCheckTimeoutMs } from "../domain/limits.js"

export type Dependency = "nats" | "postgres"

export interface ReadinessReport {
  readonly ready: boolean
  /** What is down, by name; empty when ready. */
  readonly down: ReadonlyArray<Dependency>
  /** Why each is down (never a secret: an error's message, or that it is not connected yet). */
  readonly reasons: Readonly<Partial<Record<Dependency, string>>>
}

export interface Readiness {
  readonly report: () => ReadinessReport
  /** From now on NATS counts as up while `connected()` says so. Until called: down, starting. */
  readonly watchNats: (connected: () => boolean) => void
  /** Asks Postgres `ping` periodically for the life of the scope. Until its first answer: down. */
  readonly watchPostgres: (
    ping: Effect.Effect<void, unknown>,
    options?: { readonly intervalMs?: number; readonly timeoutMs?: number }
  ) => Effect.Effect<void, never, Scope.Scope>
}

/** A tagged error's `reason` (StoreUnavailable), else its message. */
const reasonOf = (cause: unknown): string => {
  const reason =
    typeof cause === "object" && cause !== null ? (cause as { reason?: unknown }).reason : undefined
  if (typeof reason === "string") return reason
  return cause instanceof Error ? cause.message : String(cause)
}

export const makeReadiness = (): Readiness => {
  let natsConnected: (() => boolean) | undefined
  let postgresDown: string | undefined = "not checked yet"

  const report = (): ReadinessReport => {
    const reasons: Partial<Record<Dependency, string>> = {}
    if (natsConnected === undefined) reasons.nats = "not connected yet"
    else if (!natsConnected()) reasons.nats = "disconnected"
    if (postgresDown !== undefined) reasons.postgres = postgresDown
    const down = (Object.keys(reasons) as Array<Dependency>).sort()
    return { ready: down.length === 0, down, reasons }
  }

  const watchPostgres: Readiness["watchPostgres"] = (ping, options = {}) => {
    const timeoutMs = options.timeoutMs ?? readinessCheckTimeoutMs
    const check = ping.pipe(
      Effect.timeoutOption(Duration.millis(timeoutMs)),
      Effect.match({
        onFailure: (cause) => {
          postgresDown = reasonOf(cause)
        },
        onSuccess: (answered) => {
          postgresDown = answered._tag === "Some" ? undefined : `no answer within ${timeoutMs} ms`
        }
      })
    )
    return Effect.asVoid(
      Effect.forkScoped(
        Effect.forever(
          Effect.andThen(check, Effect.sleep(Duration.millis(options.intervalMs ?? readinessCheckIntervalMs)))
        )
      )
    )
  }

  return {
    report,
    watchNats: (connected) => {
      natsConnected = connected
    },
    watchPostgres
  }
}
