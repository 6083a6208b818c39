/**
 * Readiness (`GET /readyz`): connected to NATS and Postgres answering, and (scaled out) this process's
 * clock within QUOTA_CLOCK_OFFSET_MAX_MS of Postgres's. NATS's state is read from the
 * connection when asked; Postgres is asked every `readinessCheckIntervalMs` by a fiber of the serve
 * scope (one query, bounded by `readinessCheckTimeoutMs`, that also asks whether the server takes
 * writes: a standby or a read-only server is down, "connected to a standby (in recovery)"; no server at the
 * address, "no server answers", as while a failover moves it), so a probe never waits on the
 * database and an outage shows within about interval + timeout, and its end as soon after.
 *
 * Readiness is this process's: a partition that no process has held for longer than a lease (the
 * ownership round's survey, src/cluster/UnownedPartitions.ts) is listed in the body, ready or not,
 * without making this process unready (it would take the partitions it serves out of service too).
 *
 * The 503 body goes to whoever can reach the port, so it says only what is down and a fixed reason;
 * the error itself (hosts, database and user names in Postgres's text) goes to the log, once per
 * change of state, through `onChange`.
 */
import { Duration, Effect } from "effect"
import type { Scope } from "effect"
import { connectionFailedIn } from "../store/postgres/errors.js"
import { serverNotWritableIn } from "../store/postgres/writablePrimary.js"
import { readinessCheckIntervalMs, readinessCheckTimeoutMs } from "../domain/limits.js"

/** `clock`: this process's clock against Postgres's (QUOTA_CLOCK_OFFSET_MAX_MS), not a service. */
export type Dependency = "nats" | "postgres" | "clock"

export interface ReadinessReport {
  readonly ready: boolean
  /** What is down, by name; empty when ready. */
  readonly down: ReadonlyArray<Dependency>
  /** Why each is down, in fixed words (`postgresReasons`, "disconnected"): never an error's text. */
  readonly reasons: Readonly<Partial<Record<Dependency, string>>>
  /** Partitions no process has held for longer than a lease, in order; empty when all are held. */
  readonly unownedPartitions: ReadonlyArray<number>
}

export interface Readiness {
  readonly report: () => ReadinessReport
  /** From now on NATS counts as up while `connected()` says so. Until called: down, starting. */
  readonly watchNats: (connected: () => boolean) => void
  /**
   * From now on the clock counts as down while `beyond()` says so (scaled out: its offset from
   * Postgres's clock is beyond the bound, and the process serves nothing). Until called: not checked.
   */
  readonly watchClock: (beyond: () => boolean) => void
  /** From now on the report lists the partitions `unowned()` gives (the ownership rounds' survey). */
  readonly watchPartitions: (unowned: () => ReadonlyArray<number>) => void
  /** Asks Postgres `ping` periodically for the life of the scope. Until its first answer: down. */
  readonly watchPostgres: (
    ping: Effect.Effect<void, unknown>,
    options?: { readonly intervalMs?: number; readonly timeoutMs?: number }
  ) => Effect.Effect<void, never, Scope.Scope>
}

/** What /readyz says of Postgres while it is down. */
export const postgresReasons = {
  notChecked: "not checked yet",
  failed: "check failed (the cause is in the log)",
  /** Refused, reset, shutting down: no server at the address now (down, or a failover under way). */
  unreachable: "no server answers (connection refused, reset or shutting down)",
  timedOut: (timeoutMs: number) => `no answer within ${timeoutMs} ms`
} as const

/** What /readyz says of the clock while it is beyond the bound (the measurement is in the log). */
export const clockBeyondReason = "offset from Postgres's clock beyond QUOTA_CLOCK_OFFSET_MAX_MS"

/** A change of a dependency's state, with what happened (for the log only). */
export interface ReadinessChange {
  readonly dependency: Dependency
  /** The new state: the reason it is down (as /readyz says it), or undefined when it is up again. */
  readonly down: string | undefined
  /** The error or the timeout, in full: for the log, never for the HTTP body. */
  readonly detail: string | undefined
}

/** A tagged error's `reason` (StoreUnavailable), else its message. */
const detailOf = (cause: unknown): string => {
  const reason =
    typeof cause === "object" && cause !== null ? (cause as { reason?: unknown }).reason : undefined
  if (typeof reason === "string") return reason
  return cause instanceof Error ? cause.message : String(cause)
}

export const makeReadiness = (onChange: (change: ReadinessChange) => void = () => {}): Readiness => {
  let natsConnected: (() => boolean) | undefined
  let unownedPartitions: () => ReadonlyArray<number> = () => []
  let postgresDown: string | undefined = postgresReasons.notChecked
  let clockBeyond: () => boolean = () => false

  /** Records Postgres's state; tells `onChange` only when it changed (a check runs every second). */
  const setPostgres = (down: string | undefined, detail: string | undefined): void => {
    if (down === postgresDown) return
    postgresDown = down
    onChange({ dependency: "postgres", down, detail })
  }

  const report = (): ReadinessReport => {
    const reasons: Partial<Record<Dependency, string>> = {}
    if (natsConnected === undefined) reasons.nats = "not connected yet"
    else if (!natsConnected()) reasons.nats = "disconnected"
    if (postgresDown !== undefined) reasons.postgres = postgresDown
    if (clockBeyond()) reasons.clock = clockBeyondReason
    const down = (Object.keys(reasons) as Array<Dependency>).sort()
    return { ready: down.length === 0, down, reasons, unownedPartitions: unownedPartitions() }
  }

  const watchPostgres: Readiness["watchPostgres"] = (ping, options = {}) => {
    const timeoutMs = options.timeoutMs ?? readinessCheckTimeoutMs
    const check = ping.pipe(
      Effect.timeoutOption(Duration.millis(timeoutMs)),
      Effect.match({
        onFailure: (cause) =>
          setPostgres(
            serverNotWritableIn(cause)?.reason ??
              (connectionFailedIn(cause) ? postgresReasons.unreachable : postgresReasons.failed),
            detailOf(cause)
          ),
        onSuccess: (answered) =>
          answered._tag === "Some"
            ? setPostgres(undefined, undefined)
            : setPostgres(
                postgresReasons.timedOut(timeoutMs),
                `the readiness check not answered within ${timeoutMs} ms`
              )
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
    watchClock: (beyond) => {
      clockBeyond = beyond
    },
    watchPartitions: (unowned) => {
      unownedPartitions = unowned
    },
    watchPostgres
  }
}
