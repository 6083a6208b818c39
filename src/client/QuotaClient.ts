/**
 * The client of quota-coordinator: one typed method per PROTOCOL.md operation, in a Promise flavour
 * (the methods) and an Effect flavour (`client.effect`). Commands are routed to their user's
 * partition, coalesced into batch messages and retried when the protocol says a retry is safe (see
 * CommandDispatcher). Helpers `withHold` and `withSlot` run work under a hold or in a slot.
 */
import type { ConnectionOptions, NatsConnection } from "@nats-io/transport-node"
import { Cause, Effect } from "effect"
import type { NatsConnectionSettings } from "../config/natsConnection.js"
import {
  checkNatsConnectionSettings,
  natsUrlDefault,
  readNatsConnectionSettings
} from "../config/natsConnection.js"
import type { Environment, SettingsInvalid } from "../config/SettingsInvalid.js"
import { connectNats } from "../transport/natsConnect.js"
import type { EventsOptions, EventSubscription } from "./events.js"
import { subscribeEvents } from "./events.js"
import { partitionOf } from "../domain/partition.js"
import type { Result } from "../domain/results.js"
import type { ClientCounters } from "./CommandDispatcher.js"
import { CommandAbandoned, CommandDispatcher } from "./CommandDispatcher.js"
import type { QuotaClientError } from "./errors.js"
import {
  QuotaClientClosed,
  QuotaRetriesExhausted,
  QuotaServiceError,
  QuotaTransportError,
  SlotWaitAborted,
  UsageListRefused
} from "./errors.js"
import type { QuotaClientOptions, ResolvedOptions } from "./options.js"
import { resolveOptions } from "./options.js"
import { resolveSubjectSettings } from "./subjectSettings.js"
import type {
  AcquireSlotInput,
  AdjustCommandResult,
  AdjustInput,
  CommitInput,
  ConsumeInput,
  ExtendInput,
  GetUsageInput,
  GetUsageResult,
  HoldChangeResult,
  ListHoldsInput,
  ListHoldsResult,
  ListUsageOptions,
  ListUsageResult,
  ReleaseInput,
  ReleaseSlotInput,
  RenewSlotInput,
  ReserveInput,
  ReserveResult,
  SetLimitInput,
  SetLimitResult,
  SetPlanInput,
  SetPlanResult,
  SlotCommandResult,
  UsageHistoryOptions,
  UsageHistoryCommandResult,
  UsagePage,
  UsagePagesOptions
} from "./types.js"
import type { HoldInput, HoldWork, HoldWorkDone, HoldWorkOutcome } from "./withHold.js"
import { withHold } from "./withHold.js"
import type { AcquireSlotOptions, SlotInput, SlotWork } from "./withSlot.js"
import { withSlot } from "./withSlot.js"

/**
 * How to reach NATS: the same things `serve` and the CLI read from NATS_URL, NATS_USER, NATS_PASSWORD,
 * NATS_TOKEN, NATS_CREDS, NATS_NKEY, NATS_CA, NATS_CERT and NATS_KEY (PROTOCOL.md "Connecting and
 * permissions"), as options; with `env` the variables fill in what the options leave out.
 */
export interface QuotaClientConnectOptions extends QuotaClientOptions {
  /** NATS server URLs (comma-separated in one string, or a list); default nats://127.0.0.1:4222. */
  readonly servers?: string | ReadonlyArray<string>
  /**
   * An existing connection to use; the client then leaves it open on `close`. The connection options
   * are then ignored (`env`, `discover`, prefix and partitions still apply).
   */
  readonly nc?: NatsConnection
  /**
   * Read NATS_*, QUOTA_PREFIX and QUOTA_PARTITIONS from this environment (e.g. `process.env`) for
   * whatever the options leave out, as the coordinator reads them.
   */
  readonly env?: Environment
  /**
   * Learn prefix and partitions from the running coordinator (its `$SRV.INFO` metadata) where the
   * options and `env` leave them out; a value they give that differs from the coordinator's fails the
   * connect with `CoordinatorDisagrees` (`DiscoveryFailed` when no coordinator answers). Costs one
   * round of `$SRV.INFO` at connect (about 150 ms after the last coordinator's answer).
   */
  readonly discover?: boolean
  readonly user?: string
  readonly password?: string
  readonly token?: string
  /** A .creds file (user JWT and nkey seed). */
  readonly credsFile?: string
  /** A file holding an nkey seed. */
  readonly nkeyFile?: string
  /** TLS: the CA that signs the server's certificate. */
  readonly caFile?: string
  /** TLS: a client certificate and its key, for mutual TLS. */
  readonly certFile?: string
  readonly keyFile?: string
  /** Any other nats.js connection option, passed through and applied last. */
  readonly connectionOptions?: Partial<ConnectionOptions>
}

const authenticationKeys = ["user", "password", "token", "credsFile", "nkeyFile"] as const
const tlsKeys = ["caFile", "certFile", "keyFile"] as const

/**
 * The connection settings of `options`, over those of `options.env`: servers and TLS files field by
 * field; authentication as a whole (one way to authenticate in the options replaces the environment's).
 */
export const connectionSettingsOf = (
  options: QuotaClientConnectOptions
): Effect.Effect<NatsConnectionSettings, SettingsInvalid> =>
  Effect.gen(function* () {
    const fromEnv: NatsConnectionSettings =
      options.env === undefined
        ? { servers: [natsUrlDefault] }
        : yield* readNatsConnectionSettings(options.env)
    const settings: Record<string, unknown> = { ...fromEnv }
    if (authenticationKeys.some((key) => options[key] !== undefined))
      for (const key of authenticationKeys) delete settings[key]
    for (const key of [...authenticationKeys, ...tlsKeys])
      if (options[key] !== undefined) settings[key] = options[key]
    if (options.servers !== undefined)
      settings["servers"] = (
        typeof options.servers === "string" ? options.servers.split(",") : [...options.servers]
      ).map((server) => server.trim())
    return yield* checkNatsConnectionSettings(settings as unknown as NatsConnectionSettings)
  })

type SubjectKind = "ops" | "admin"

/**
 * The Effect flavour: the same operations, failing with a `QuotaClientError` in the error channel.
 * Interrupting one stops waiting for its result, not the command: once queued it is sent (and may take
 * effect), which is safe because a repeat with the same id is answered `exists`.
 */
export interface QuotaClientEffects {
  readonly reserve: (input: ReserveInput) => Effect.Effect<ReserveResult, QuotaClientError>
  readonly consume: (input: ConsumeInput) => Effect.Effect<HoldChangeResult, QuotaClientError>
  readonly commit: (input: CommitInput) => Effect.Effect<HoldChangeResult, QuotaClientError>
  readonly release: (input: ReleaseInput) => Effect.Effect<HoldChangeResult, QuotaClientError>
  readonly extend: (input: ExtendInput) => Effect.Effect<HoldChangeResult, QuotaClientError>
  readonly adjust: (input: AdjustInput) => Effect.Effect<AdjustCommandResult, QuotaClientError>
  /** Interrupting it while it waits withdraws the wait, as an aborted `signal` does. */
  readonly acquireSlot: (input: AcquireSlotInput) => Effect.Effect<SlotCommandResult, QuotaClientError>
  readonly renewSlot: (input: RenewSlotInput) => Effect.Effect<SlotCommandResult, QuotaClientError>
  readonly releaseSlot: (input: ReleaseSlotInput) => Effect.Effect<SlotCommandResult, QuotaClientError>
  readonly getUsage: (input: GetUsageInput) => Effect.Effect<GetUsageResult, QuotaClientError>
  readonly setPlan: (input: SetPlanInput) => Effect.Effect<SetPlanResult, QuotaClientError>
  readonly setLimit: (input: SetLimitInput) => Effect.Effect<SetLimitResult, QuotaClientError>
  readonly listHolds: (input: ListHoldsInput) => Effect.Effect<ListHoldsResult, QuotaClientError>
  readonly usageHistory: (
    user: string,
    options?: UsageHistoryOptions
  ) => Effect.Effect<UsageHistoryCommandResult, QuotaClientError>
  readonly listUsage: (
    partition: number,
    options: ListUsageOptions
  ) => Effect.Effect<ListUsageResult, QuotaClientError>
}

const isQuotaClientError = (error: unknown): error is QuotaClientError =>
  error instanceof QuotaRetriesExhausted ||
  error instanceof QuotaServiceError ||
  error instanceof QuotaTransportError ||
  error instanceof QuotaClientClosed

/** The dispatcher rejects only with client errors; anything else is a bug, so it becomes a defect. */
const toQuotaClientError = (error: unknown): QuotaClientError => {
  if (isQuotaClientError(error)) return error
  throw error
}

const lift =
  <I, R>(call: (input: I) => Promise<R>) =>
  (input: I): Effect.Effect<R, QuotaClientError> =>
    Effect.tryPromise({ try: () => call(input), catch: toQuotaClientError })

export class QuotaClient {
  /**
   * Connects to NATS (or adopts `options.nc`) and returns a client. Rejects with `SettingsInvalid`
   * (a setting or file that cannot be used, naming the variable and path), `NatsConnectFailed`
   * (the servers, redacted, and why: refused credentials, TLS, unreachable), and with `discover`
   * `DiscoveryFailed` or `CoordinatorDisagrees`.
   */
  static async connect(options: QuotaClientConnectOptions = {}): Promise<QuotaClient> {
    if (options.nc !== undefined) {
      const subjects = await resolveSubjectSettings(options.nc, options)
      return new QuotaClient(options.nc, { ...options, ...subjects })
    }
    const nc = await Effect.runPromise(
      Effect.flatMap(connectionSettingsOf(options), (settings) =>
        connectNats(settings, {
          name: "quota-client",
          // Async traces build two Errors with stacks per request: at high rates a large share of the
          // client's CPU. Our errors name the subject and op instead.
          noAsyncTraces: true,
          ...options.connectionOptions
        })
      )
    ).catch((error: unknown) => {
      // Effect wraps a failure for a Promise; the caller gets the error itself.
      throw Cause.isCause(error) ? Cause.squash(error) : error
    })
    try {
      const subjects = await resolveSubjectSettings(nc, options)
      return new QuotaClient(nc, { ...options, ...subjects }, true)
    } catch (error) {
      await nc.close()
      throw error
    }
  }

  readonly effect: QuotaClientEffects
  private readonly options: ResolvedOptions
  private readonly dispatcher: CommandDispatcher

  /**
   * A client on an existing connection. `ownsConnection` makes `close` close it too (as after
   * `connect` with servers); by default the connection stays the caller's.
   */
  constructor(
    readonly nc: NatsConnection,
    options: QuotaClientOptions = {},
    private readonly ownsConnection = false
  ) {
    this.options = resolveOptions(options)
    this.dispatcher = new CommandDispatcher(nc, this.options)
    this.effect = {
      reserve: lift((input) => this.reserve(input)),
      consume: lift((input) => this.consume(input)),
      commit: lift((input) => this.commit(input)),
      release: lift((input) => this.release(input)),
      extend: lift((input) => this.extend(input)),
      adjust: lift((input) => this.adjust(input)),
      acquireSlot: (input) =>
        Effect.tryPromise({
          try: (signal) => this.acquireSlot(input, { signal }),
          catch: toQuotaClientError
        }),
      renewSlot: lift((input) => this.renewSlot(input)),
      releaseSlot: lift((input) => this.releaseSlot(input)),
      getUsage: lift((input) => this.getUsage(input)),
      setPlan: lift((input) => this.setPlan(input)),
      setLimit: lift((input) => this.setLimit(input)),
      listHolds: lift((input) => this.listHolds(input)),
      usageHistory: (user, options) =>
        Effect.tryPromise({ try: () => this.usageHistory(user, options), catch: toQuotaClientError }),
      listUsage: (partition, options) =>
        Effect.tryPromise({ try: () => this.listUsage(partition, options), catch: toQuotaClientError })
    }
  }

  /** The deployment's partition count the client routes by (`list_usage` walks 0 to partitions - 1). */
  get partitions(): number {
    return this.options.partitions
  }

  /** The subject a user's commands of this kind go to: `{prefix}.v1.{partition}.{kind}`. */
  subjectOf(user: string, kind: SubjectKind = "ops"): string {
    if (typeof user !== "string") throw new TypeError(`user must be a string, got ${typeof user}`)
    return `${this.options.prefix}.v1.${partitionOf(user, this.options.partitions)}.${kind}`
  }

  reserve(input: ReserveInput): Promise<ReserveResult> {
    return this.send<ReserveResult>("ops", { ...input, op: "reserve" })
  }

  consume(input: ConsumeInput): Promise<HoldChangeResult> {
    return this.send<HoldChangeResult>("ops", { ...input, op: "consume" })
  }

  commit(input: CommitInput): Promise<HoldChangeResult> {
    return this.send<HoldChangeResult>("ops", { ...input, op: "commit" })
  }

  release(input: ReleaseInput): Promise<HoldChangeResult> {
    return this.send<HoldChangeResult>("ops", { ...input, op: "release" })
  }

  extend(input: ExtendInput): Promise<HoldChangeResult> {
    return this.send<HoldChangeResult>("ops", { ...input, op: "extend" })
  }

  adjust(input: AdjustInput): Promise<AdjustCommandResult> {
    return this.send<AdjustCommandResult>("ops", { ...input, op: "adjust" })
  }

  /**
   * `busy` is an answer, not retried: the caller snoozes `retryAfterMs`. With `waitMs` the command
   * goes in a message of its own and its reply timeout is extended by the wait.
   *
   * When `options.signal` aborts before the answer, the wait is withdrawn: an `acquire_slot` of the same
   * job with `waitMs` 0 replaces the waiting one at the coordinator (PROTOCOL 1.2), and whatever that
   * answer grants (`acquired`, or `exists` when the wait had just been granted) is released; then the
   * call rejects with `SlotWaitAborted`. The freed slot goes to the next waiter at once, not when a
   * lease of a job nobody runs any more ends.
   */
  async acquireSlot(input: AcquireSlotInput, options: AcquireSlotOptions = {}): Promise<SlotCommandResult> {
    const waitMs = typeof input.waitMs === "number" && input.waitMs > 0 ? input.waitMs : 0
    const { signal } = options
    const command = { ...input, op: "acquire_slot" }
    if (signal === undefined) return this.send<SlotCommandResult>("ops", command, waitMs)
    const aborted = (withdrawn?: string, released?: string) =>
      new SlotWaitAborted({
        user: input.user,
        job: input.job,
        waitMs,
        withdrawn,
        released,
        reason: signal.reason
      })
    if (signal.aborted) throw aborted()
    try {
      return await this.send<SlotCommandResult>("ops", command, waitMs, signal)
    } catch (error) {
      if (!(error instanceof CommandAbandoned)) throw error
    }
    const { user, job } = input
    const withdrawal = { user, job, op: "acquire_slot", waitMs: 0 }
    const withdraw = await this.send<SlotCommandResult>("ops", withdrawal).catch(() => undefined)
    if (withdraw?.status !== "acquired" && withdraw?.status !== "exists") throw aborted(withdraw?.status)
    const release = await this.releaseSlot({ user, job }).catch(() => undefined)
    throw aborted(withdraw.status, release?.status)
  }

  renewSlot(input: RenewSlotInput): Promise<SlotCommandResult> {
    return this.send<SlotCommandResult>("ops", { ...input, op: "renew_slot" })
  }

  releaseSlot(input: ReleaseSlotInput): Promise<SlotCommandResult> {
    return this.send<SlotCommandResult>("ops", { ...input, op: "release_slot" })
  }

  getUsage(input: GetUsageInput): Promise<GetUsageResult> {
    return this.send<GetUsageResult>("ops", { ...input, op: "get_usage" })
  }

  /** Administration: sent to the `.admin` subject, which NATS permissions may reserve to operators. */
  setPlan(input: SetPlanInput): Promise<SetPlanResult> {
    return this.send<SetPlanResult>("admin", { ...input, op: "set_plan" })
  }

  /** Administration: `limit: null` returns the meter to the plan's default. */
  setLimit(input: SetLimitInput): Promise<SetLimitResult> {
    return this.send<SetLimitResult>("admin", { ...input, op: "set_limit" })
  }

  /** Administration: a user's holds, oldest first, with `more` when `limit` cut the list. */
  listHolds(input: ListHoldsInput): Promise<ListHoldsResult> {
    return this.send<ListHoldsResult>("admin", { ...input, op: "list_holds" })
  }

  /**
   * Administration (revision 1.3): the user's `used` per period of each `month` or `day` meter (or of
   * `options.meter`), newest first, the current period always.
   */
  usageHistory(user: string, options: UsageHistoryOptions = {}): Promise<UsageHistoryCommandResult> {
    return this.send<UsageHistoryCommandResult>("admin", { ...options, user, op: "usage_history" })
  }

  /**
   * Administration (revision 1.3): one page of `partition`'s users whose `used` in the period is above
   * 0, by their UTF-8 bytes; with `more`, ask again with `after` set to the last user. Sent to the
   * partition's `.admin` subject, with no user.
   */
  listUsage(partition: number, options: ListUsageOptions): Promise<ListUsageResult> {
    if (!Number.isInteger(partition) || partition < 0 || partition >= this.options.partitions)
      return Promise.reject(
        new RangeError(
          `partition must be an integer from 0 to ${this.options.partitions - 1}, got ${partition}`
        )
      )
    const subject = `${this.options.prefix}.v1.${partition}.admin`
    // The coordinator answers list_usage with list_usage's result shapes; the type records which.
    return this.dispatcher.submit(subject, { ...options, op: "list_usage" }) as Promise<ListUsageResult>
  }

  /**
   * Every partition's `list_usage` of one meter and period, page by page: partition 0 to the last, each
   * paged with `after` until it answers `more: false`. One request in flight at a time, so memory
   * stays one page (at most `limit` users) whatever the deployment holds. A refusal ends the walk with
   * `UsageListRefused`; a failure to reach a partition with the `QuotaClientError` of that request.
   * A billing job runs it after the period ended, when its figures are final (PROTOCOL 1.3).
   */
  async *usagePages(options: UsagePagesOptions): AsyncGenerator<UsagePage, void, undefined> {
    for (let partition = 0; partition < this.options.partitions; partition++) {
      let after: string | undefined
      for (;;) {
        const result = await this.listUsage(partition, after === undefined ? options : { ...options, after })
        if (result.status !== "ok") throw new UsageListRefused({ partition, meter: options.meter, result })
        yield { partition, usage: result.usage, more: result.more }
        if (!result.more) break
        const last = result.usage.at(-1)
        // `more` with no user to go on from: asking again would get the same page forever.
        if (last === undefined)
          throw new QuotaTransportError({
            subject: `${this.options.prefix}.v1.${partition}.admin`,
            op: "list_usage",
            reason: "reply says more with an empty usage list"
          })
        after = last.user
      }
    }
  }

  /**
   * The coordinator's events (thresholds crossed, orphaned holds, expired slots, plan and limit
   * changes) from their JetStream stream, as an async iterator of deliveries to acknowledge.
   * See src/client/events.ts.
   */
  events(options: EventsOptions = {}): Promise<EventSubscription> {
    return subscribeEvents(this.nc, this.options.prefix, options)
  }

  /**
   * Reserves, runs `work`, commits the amount it reports and releases the hold if it throws.
   * Throws `HoldNotGranted` (carrying the result) when the reserve is not `reserved`/`exists`.
   */
  withHold<W extends HoldWorkDone>(input: HoldInput, work: HoldWork<W>): Promise<HoldWorkOutcome<W>> {
    return withHold(this, input, work)
  }

  /**
   * Acquires a slot (waiting up to `waitMs`), renews its lease while `work` runs and releases it
   * afterwards, also on failure. Throws `SlotBusy` with `retryAfterMs` when no slot came free.
   */
  withSlot<W>(input: SlotInput, work: SlotWork<W>): Promise<W> {
    return withSlot(this, input, work)
  }

  counters(): ClientCounters {
    return this.dispatcher.counters()
  }

  /**
   * Fails what is queued or waiting to be retried with `QuotaClientClosed`, waits for the messages in
   * flight, then closes the NATS connection if the client opened it.
   */
  async close(): Promise<void> {
    await this.dispatcher.close()
    if (this.ownsConnection) await this.nc.close()
  }

  private send<R extends Result>(
    kind: SubjectKind,
    command: { readonly op: string; readonly user: string },
    extraTimeoutMs = 0,
    signal?: AbortSignal
  ): Promise<R> {
    let subject: string
    try {
      subject = this.subjectOf(command.user, kind)
    } catch (error) {
      return Promise.reject(error)
    }
    // The coordinator answers each op with that op's result shapes; the types record which.
    return this.dispatcher.submit(subject, command, extraTimeoutMs, signal) as Promise<R>
  }
}
