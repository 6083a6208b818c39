/**
 * One partition's actor: the single writer of every user of its partition. Its one fiber runs a plain
 * loop over named stages (as TigerBeetle's replica runs its commit stages):
 *
 *   finish   the batch whose write came back: answer it (durable), or answer it `unavailable` and
 *            forget the memory of the users it touched (the next command reloads them)
 *   tick     users whose deadline passed (hold expiry, lease end, a waiter's wait) get a `tick`
 *   form     take queued commands (up to batchCommandsMax) of users in memory; a user not in memory is
 *            loaded (one store call for all of them) and its commands wait for the load, in order
 *   prefetch ids the memory forgot and past periods a `usage_history` reads, asked of the store first
 *   decide   synchronous: `decideInto` for each command in order, into one list of events and replies
 *   write    one store submission for the batch, under the epoch the memory was loaded under
 *
 * One batch is in flight at a time: the next one is formed once this one's write is durable, so
 * replies leave in durable order, a grant is never sent before its write is durable, and one writer
 * per user holds by construction (a user's commands are decided only in this loop, one batch after
 * another). What arrives meanwhile queues and becomes the next batch: a busy partition gets many
 * commands per commit. Several partitions' writes share a transaction in the store's group commit.
 *
 * A waiting `acquire_slot` is an entry of the user's queue in its state, carrying its envelope as the
 * reply handle (replies.ts): the decision that wakes it hands the envelope back with the result.
 */
import { Cause, Effect, Exit } from "effect"
import type { Fiber } from "effect"
import type { Command } from "../domain/commands.js"
import type { Config } from "../domain/config.js"
import type { DecideContext, Output } from "../domain/context.js"
import { decideInto } from "../domain/decide.js"
import type { StoreEvent, StoredUser } from "../domain/events.js"
import { assertUserState } from "../domain/invariants.js"
import { failedWriteRetryDelayMs, recallIdsMax } from "../domain/limits.js"
import type { Result } from "../domain/results.js"
import { overloaded, unavailable } from "../domain/results.js"
import { busyResult } from "../domain/slots.js"
import {
  idsToRecall,
  nextDeadline,
  periodFloorToStore,
  planOf,
  rememberRecalled,
  userStateFromStored
} from "../domain/state.js"
import { usageHistoryMeters } from "../domain/usageHistory.js"
import type { MetricsRecorder } from "../ops/MetricsRecorder.js"
import type { StoreShape, StoreUnavailable } from "../store/Store.js"
import { DeadlineHeap } from "./DeadlineHeap.js"
import type { Envelope, Reply } from "./replies.js"
import { answer, envelopeOf, handleOf, makeEnvelope } from "./replies.js"
import type { Residency, Resident, ResidentHome } from "./ResidentUsers.js"
import { makeResident } from "./ResidentUsers.js"
import type { EventQueue, PublishedEvent } from "../events/EventQueue.js"
import { PartitionLog } from "./PartitionLog.js"
import { turnEndsAt } from "./turn.js"

/** What every partition actor of a process shares. */
export interface PartitionSettings {
  readonly config: Config
  readonly store: StoreShape
  /** Effect's clock, read synchronously (tests drive it with TestClock). */
  readonly now: () => number
  readonly random: () => number
  readonly batchCommandsMax: number
  readonly mailboxCapacity: number
  /** Recount every aggregate after each decision (tests). */
  readonly assertFull: boolean
  readonly residency: Residency
  /**
   * The epoch under which this process may decide for the partition now (scaled out: it holds the
   * partition under that epoch and its lease has not run out locally), undefined when it may not.
   */
  readonly servingEpoch: (partition: number) => number | undefined
  readonly metrics: MetricsRecorder
  readonly onError: (user: string, message: string, cause: unknown) => void
  /** Told of each batch's events once durable (logs of expiries, metrics). */
  readonly onPersisted: (events: ReadonlyArray<StoreEvent>) => void
  /** Runs a store call in the background (the coordinator's runtime); its observer reports the exit. */
  readonly runFork: <A, E>(effect: Effect.Effect<A, E>) => Fiber.Fiber<A, E>
  /** A claim token, drawn when the actor opens its partition's log (random: unique across processes). */
  readonly newToken: () => string
  /** Where confirmed appends' events go to be published (absent: events are not published). */
  readonly eventQueue?: EventQueue
}

/** The commands decided together and written in one submission. */
interface Batch {
  readonly envelopes: Array<Envelope>
  /** The users it touched, each once. */
  readonly residents: Array<Resident>
  /** What the domain answered, in decision order: each command's result and each wakeup's. */
  readonly replies: Array<Envelope | Result>
  readonly events: Array<StoreEvent>
  /** Clock ms of its decisions. */
  decidedAt: number
  /** Set when its prefetch or write ended; the loop finishes it. */
  outcome: "prefetched" | "written" | "failed" | undefined
  /** Its place in the log, once it writes. */
  position: number
  /**
   * Answered `unavailable` already (the actor recovered from a crash of its own code): its store call
   * is awaited all the same, so that no user is loaded again while a write of it may still land.
   */
  abandoned: boolean
  /** The store call in flight (prefetch or write), interrupted if the partition is dropped. */
  call: Fiber.Fiber<unknown, unknown> | undefined
}

/** A timer's tick answers nobody. */
const ignoreReply: Reply = () => {}

const reportStoreFailure = (
  settings: PartitionSettings,
  user: string,
  what: string,
  cause: Cause.Cause<StoreUnavailable>
): void => {
  // Interrupted: the partition was dropped, and says so itself.
  if (Cause.hasInterruptsOnly(cause)) return
  settings.onError(user, what, Cause.squash(cause))
}

export class PartitionActor implements ResidentHome {
  /** The partition's users in memory. */
  readonly users = new Map<string, Resident>()
  /** Commands taken and not yet in a batch, in arrival order (users' orders kept). */
  private inbox: Array<Envelope> = []
  private batch: Batch | undefined = undefined
  /** The epoch the memory was loaded under; undefined before the first batch. */
  private epoch: number | undefined = undefined
  /** Bumped whenever memory is forgotten: a load begun before it is discarded. */
  private generation = 0
  /** Store loads and `list_usage` reads in flight. */
  private reads = 0
  private readonly deadlines = new DeadlineHeap<Resident>()
  /** Closing: what remains is answered `unavailable` and nothing more is taken. */
  private closed = false
  /** Stopping (a hand-off, a shutdown): waiters are answered `unavailable` instead of waiting. */
  private releasing = false
  private resume: (() => void) | undefined = undefined
  private readonly idleListeners: Array<() => void> = []
  /** The moment the timer fiber sleeps until (Infinity: none) and how to stop it. */
  private timerAt = Infinity
  private timer: Fiber.Fiber<void> | undefined = undefined
  /** The log: positions, appends not yet checkpointed, the checkpoint. */
  private readonly log = new PartitionLog()
  /** Users to load once a checkpoint brings their failed append's outcome into the tables. */
  private loadsAfterCheckpoint: Array<Resident> = []
  /** Dirty users at rest: the residency may take them once a checkpoint makes them clean. */
  private restAfterCheckpoint: Array<Resident> = []
  /** What waits for every final append to be in the tables (an admin read of them, a prefetch of a dirty user); told `dropped` when the checkpoint fails. */
  private checkpointWaiters: Array<{ readonly ready: () => void; readonly dropped: () => void }> = []
  /** No checkpoint starts before it after one failed (Clock ms). */
  private checkpointRetryAt = 0
  /** What waits for the log to be opened (the orphan sweep, before it reads the tables). */
  private openWaiters: Array<() => void> = []
  /** No open starts before it after one failed (Clock ms): what waits for it does not drive a loop. */
  private openRetryAt = -Infinity

  constructor(
    readonly partition: number,
    private readonly settings: PartitionSettings
  ) {}

  // ---------------------------------------------------------------------------------------------
  // Entry points (called synchronously by the coordinator)

  /**
   * Queues a command; `overloaded` at once when its user would pass the resident cap or its queue
   * bound. Commands of a user are decided in the order they are enqueued.
   */
  enqueue(command: Command, reply: Reply): void {
    if (this.closed) return reply(unavailable)
    const { residency } = this.settings
    let resident = this.users.get(command.user)
    if (resident === undefined) {
      if (!residency.makeRoom()) return reply(overloaded)
      resident = makeResident(command.user, this, this.settings.now())
      residency.admit(resident)
    }
    if (resident.queued >= this.settings.mailboxCapacity) return reply(overloaded)
    this.queue(resident, makeEnvelope(command, reply))
  }

  /**
   * Runs a read of the partition's tables (list_usage) once every final append is in them, counted as
   * its work, so a drain waits for it. `dropped`: the partition let go of its memory first.
   */
  read(run: (done: () => void) => void, dropped: () => void): void {
    this.reads += 1
    const done = () => {
      this.reads -= 1
      this.wake()
    }
    this.afterCheckpoint(
      () => run(done),
      () => {
        dropped()
        done()
      }
    )
  }

  /**
   * Calls `done` once the partition's log is opened here (what earlier owners left is in the tables),
   * or the partition is found not served here.
   */
  whenOpened(done: () => void): void {
    if (this.log.openedFor !== undefined) return done()
    this.openWaiters.push(done)
    this.wake()
  }

  /** Calls `ready` once every final append of the partition is in the tables. */
  private afterCheckpoint(ready: () => void, dropped: () => void): void {
    if (
      this.log.openedFor !== undefined &&
      !this.log.checkpointing &&
      !this.log.checkpointDue(Infinity, true)
    )
      return ready()
    this.checkpointWaiters.push({ ready, dropped })
    this.wake()
  }

  /** Waiters answer `unavailable` from now on (their callers retry at the next owner); work in flight goes on. */
  releaseWaiters(): void {
    this.releasing = true
    const waiting: Array<Envelope> = []
    for (const resident of this.users.values())
      if (!resident.inBatch) waiting.push(...this.takeWaiters(resident))
    this.answerUnavailable(waiting)
    this.wake()
  }

  /**
   * Resolves once every final append is in the tables (or the partition let go of its memory): what a
   * drain does last, so a hand-off or a shutdown leaves the next owner no tail to bring in.
   */
  checkpointed(): Promise<void> {
    return new Promise((resolve) => this.afterCheckpoint(resolve, resolve))
  }

  /** Resolves once nothing is queued, loading, in a batch or being read. */
  whenIdle(): Promise<void> {
    if (this.isIdle()) return Promise.resolve()
    return new Promise((resolve) => this.idleListeners.push(resolve))
  }

  /**
   * Stops: the store call in flight is interrupted (a write already in a group commits or fails with
   * it, as the fence decides), and everything held is answered `unavailable` in arrival order: the
   * batch, the queue, the loads' commands, the waiters. Memory is forgotten.
   */
  close(): Array<Fiber.Fiber<unknown, unknown>> {
    this.closed = true
    const calls: Array<Fiber.Fiber<unknown, unknown>> = []
    if (this.batch?.call !== undefined) calls.push(this.batch.call)
    if (this.timer !== undefined) calls.push(this.timer)
    this.timer = undefined
    this.dropEverything()
    this.wake()
    return calls
  }

  /** `acquire_slot` callers waiting in the partition's users' queues. */
  waiters(): number {
    let count = 0
    for (const resident of this.users.values()) count += resident.state?.waiters.length ?? 0
    return count
  }

  /** The loop: the actor's one fiber. Ends when the actor is closed. */
  run(): Effect.Effect<void> {
    const wait = Effect.callback<void>((resume) => {
      this.resume = () => {
        this.resume = undefined
        resume(Effect.void)
      }
      if (this.closed || this.hasWork()) this.resume()
    })
    return Effect.gen({ self: this }, function* () {
      while (!this.closed) {
        if (!this.hasWork()) {
          this.armTimer()
          this.notifyIdle()
          yield* wait
          continue
        }
        // The loop's turn is spent (other partitions decided in it too): give it back first.
        if (performance.now() >= turnEndsAt()) yield* Effect.yieldNow
        this.stepOrRecover()
      }
    })
  }

  /**
   * A stage that throws outside a decision is a bug of this actor's own code: what it holds is
   * answered `unavailable` and its memory forgotten (the next command reloads), as after a crash, and
   * the loop goes on. Never a wrong answer, never silence.
   */
  private stepOrRecover(): void {
    const batch = this.batch
    try {
      this.step()
    } catch (cause) {
      this.settings.onError("", `partition ${this.partition} actor crashed outside a decision`, cause)
      this.batch ??= batch
      this.dropEverything()
    }
  }

  // ---------------------------------------------------------------------------------------------
  // The stages

  private hasWork(): boolean {
    if (this.closed) return false
    const now = this.settings.now()
    if (this.checkpointDue(now)) return true
    // The log being opened (or an earlier open's checkpoint still running): its end wakes the loop.
    const opening = this.log.openedFor === undefined && (this.log.opening || this.log.checkpointing)
    if (
      (this.checkpointWaiters.length > 0 || this.openWaiters.length > 0) &&
      this.log.openedFor === undefined &&
      !opening &&
      now >= this.openRetryAt
    )
      return this.batch === undefined
    const batch = this.batch
    if (batch !== undefined) return batch.outcome !== undefined
    // Commands wait for the open without driving the loop, unless the partition's epoch moved (they
    // are answered, or the open is started again under the new one).
    const inboxWork =
      this.inbox.length > 0 && (!opening || this.settings.servingEpoch(this.partition) !== this.epoch)
    return inboxWork || (this.deadlines.peek()?.at ?? Infinity) <= now
  }

  private checkpointDue(now: number): boolean {
    if (now < this.checkpointRetryAt) return false
    if (
      this.log.checkpointDue(now, this.checkpointWaiters.length > 0 || this.loadsAfterCheckpoint.length > 0)
    )
      return true
    const { eventQueue } = this.settings
    if (eventQueue === undefined) return false
    return this.log.publishedMarkDue(
      now,
      eventQueue.publishedThrough(this.partition, this.log.lastFinalPosition())
    )
  }

  private isIdle(): boolean {
    return this.batch === undefined && this.inbox.length === 0 && this.reads === 0
  }

  private notifyIdle(): void {
    if (!this.isIdle() || this.idleListeners.length === 0) return
    for (const listener of this.idleListeners.splice(0)) listener()
  }

  /** Wakes the loop (a command queued, a store call back, a deadline passed). */
  private wake(): void {
    this.resume?.()
  }

  private step(): void {
    if (this.checkpointDue(this.settings.now())) this.checkpoint()
    const batch = this.batch
    if (batch?.abandoned === true) {
      // Its call is back: nothing of it is answered again; its users load afresh.
      this.batch = undefined
      for (const resident of batch.residents) {
        resident.inBatch = false
        this.restIfIdle(resident)
      }
      return
    }
    if (batch !== undefined) {
      // The prefetch yielded to the store: the partition may have been lost meanwhile, and a batch
      // that writes nothing would be answered from memory with no fence to stop it.
      if (batch.outcome === "prefetched") {
        if (this.settings.servingEpoch(this.partition) === this.epoch) this.decideAndWrite(batch)
        else this.failBatch()
      } else if (batch.outcome === "written") this.finishWritten(batch)
      else if (batch.outcome === "failed") this.failBatch()
      return
    }
    const now = this.settings.now()
    this.tickDue(now)
    if (this.inbox.length > 0) this.formBatch(now)
    // A read of the tables waits for the log to be opened.
    else if (
      (this.checkpointWaiters.length > 0 || this.openWaiters.length > 0) &&
      this.log.openedFor === undefined
    )
      this.readyToServe()
  }

  /** A `tick` for every user whose deadline has passed, queued like any command. */
  private tickDue(now: number): void {
    for (let top = this.deadlines.peek(); top !== undefined && top.at <= now; top = this.deadlines.peek()) {
      this.deadlines.pop()
      const resident = top.key
      resident.deadline = Infinity
      // A user whose state is to be reloaded (after a failed write) is loaded by its tick.
      if (this.users.get(resident.user) !== resident) continue
      this.queue(resident, makeEnvelope({ op: "tick", user: resident.user }, ignoreReply))
    }
  }

  private queue(resident: Resident, envelope: Envelope): void {
    envelope.resident = resident
    resident.queued += 1
    this.settings.residency.unrest(resident)
    this.inbox.push(envelope)
    this.wake()
  }

  /**
   * Takes what the inbox holds (up to batchCommandsMax) for users in memory; commands of users not in
   * memory wait for one load of them all. Nothing is decided unless the partition is served here under
   * the epoch the memory was loaded under: not served, everything held is answered `unavailable`
   * undecided; served under another epoch (lost and claimed again), memory is forgotten first.
   */
  private formBatch(now: number): void {
    if (!this.readyToServe()) return
    const taken = this.inbox
    const count = Math.min(taken.length, this.settings.batchCommandsMax)
    this.inbox = count === taken.length ? [] : taken.slice(count)
    const batch: Batch = {
      envelopes: [],
      residents: [],
      replies: [],
      events: [],
      decidedAt: now,
      outcome: undefined,
      position: 0,
      abandoned: false,
      call: undefined
    }
    const toLoad: Array<Resident> = []
    for (let index = 0; index < count; index += 1) {
      const envelope = taken[index]!
      const resident = envelope.resident!
      if (resident.state === undefined || resident.loadingFor !== undefined) {
        if (resident.loadingFor === undefined) {
          resident.loadingFor = []
          toLoad.push(resident)
        }
        resident.loadingFor.push(envelope)
        continue
      }
      resident.queued -= 1
      if (!resident.inBatch) {
        resident.inBatch = true
        batch.residents.push(resident)
      }
      batch.envelopes.push(envelope)
    }
    if (toLoad.length > 0) this.load(toLoad, now)
    if (batch.envelopes.length === 0) return
    this.batch = batch
    if (!this.prefetch(batch)) this.decideAndWrite(batch)
  }

  /**
   * Opens the partition's log under `epoch`: the store brings what earlier owners appended into the
   * tables and says where the next append goes. Until then nothing is loaded or decided; a failure
   * answers the queue `unavailable` (the next command tries again).
   */
  private open(epoch: number): void {
    this.log.opening = true
    const generation = this.generation
    const call = this.settings.runFork(this.settings.store.openPartition(this.partition))
    call.addObserver((exit) => {
      if (generation !== this.generation || this.closed) return
      if (Exit.isSuccess(exit)) {
        this.log.opened(
          epoch,
          exit.value.nextPosition,
          this.settings.newToken(),
          this.settings.now(),
          this.settings.eventQueue !== undefined
        )
        this.releaseOpenWaiters()
        this.releaseCheckpointWaiters()
      } else {
        reportStoreFailure(this.settings, "", `opening partition ${this.partition}'s log failed`, exit.cause)
        this.log.opening = false
        this.openRetryAt = this.settings.now() + failedWriteRetryDelayMs
        this.answerInboxUnavailable()
      }
      this.wake()
    })
  }

  /**
   * Brings the appends not yet in the tables into them (off the request path: batches go on meanwhile).
   * Then users made clean may be evicted, loads that waited for it start, reads of the tables run.
   */
  private checkpoint(): void {
    const epoch = this.log.openedFor
    if (epoch === undefined) throw new Error("bug: a checkpoint of a log not opened")
    const { known, through } = this.log.checkpointPlan()
    const generation = this.generation
    // How far the events are in the stream: rows both checkpointed and published are deleted. With no
    // events to publish (switched off), every row is done once checkpointed.
    const { eventQueue } = this.settings
    const published =
      eventQueue === undefined ? through : eventQueue.publishedThrough(this.partition, through)
    // Under the epoch the log was opened with: once another claim moved it, the store writes nothing.
    const call = this.settings.runFork(
      this.settings.store.checkpoint(this.partition, known, through, published, epoch)
    )
    call.addObserver((exit) => {
      if (generation !== this.generation || this.closed) {
        this.log.checkpointFailed()
        this.wake()
        return
      }
      const now = this.settings.now()
      if (Exit.isFailure(exit)) {
        reportStoreFailure(this.settings, "", `checkpoint of partition ${this.partition} failed`, exit.cause)
        this.log.checkpointFailed()
        this.checkpointRetryAt = now + failedWriteRetryDelayMs
        // Loads and reads that waited for it fail with it: answered `unavailable`, not held.
        const waiting = this.loadsAfterCheckpoint
        this.loadsAfterCheckpoint = []
        if (waiting.length > 0) this.loaded(waiting, Exit.failCause(exit.cause))
        for (const waiter of this.checkpointWaiters.splice(0)) waiter.dropped()
        this.wake()
        return
      }
      this.log.checkpointDone(exit.value, published, now)
      const resting = this.restAfterCheckpoint
      this.restAfterCheckpoint = []
      for (const resident of resting) {
        resident.awaitingCheckpoint = false
        this.restIfIdle(resident)
      }
      if (!this.log.loadsBlocked() && this.loadsAfterCheckpoint.length > 0) {
        const waiting = this.loadsAfterCheckpoint
        this.loadsAfterCheckpoint = []
        this.load(waiting, now)
      }
      this.releaseCheckpointWaiters()
      this.wake()
    })
  }

  private releaseOpenWaiters(): void {
    const waiting = this.openWaiters
    this.openWaiters = []
    for (const done of waiting) done()
  }

  /** Runs the reads that waited for the tables to hold every final append, once they do. */
  private releaseCheckpointWaiters(): void {
    if (this.checkpointWaiters.length === 0 || this.log.checkpointing) return
    if (this.log.openedFor === undefined || this.log.checkpointDue(Infinity, true)) return
    const ready = this.checkpointWaiters
    this.checkpointWaiters = []
    for (const waiter of ready) waiter.ready()
  }

  /**
   * Whether the partition is served here under the epoch the memory was loaded under, with its log
   * opened: not served, everything held is answered `unavailable` undecided; served under another
   * epoch (lost and claimed again), memory is forgotten first; the log not opened under it, it is opened
   * (what an earlier owner left is brought into the tables before anything is loaded).
   */
  private readyToServe(): boolean {
    const epoch = this.settings.servingEpoch(this.partition)
    if (epoch === undefined) {
      this.epoch = undefined
      this.dropEverything()
      return false
    }
    if (epoch !== this.epoch) {
      if (this.epoch !== undefined) this.dropEverything()
      this.epoch = epoch
    }
    if (this.log.openedFor === epoch) return true
    // A checkpoint of an earlier open still running may move the marks over positions this open hands
    // out again (appends that failed there): the open waits for it (its end wakes the loop).
    if (this.log.opening || this.log.checkpointing) return false
    // An open failed a moment ago: what comes meanwhile is answered as that open's queue was.
    if (this.settings.now() < this.openRetryAt) this.answerInboxUnavailable()
    else this.open(epoch)
    return false
  }

  /** Everything queued is answered `unavailable`, undecided (the log could not be opened). */
  private answerInboxUnavailable(): void {
    const queued = this.inbox
    this.inbox = []
    for (const envelope of queued) envelope.resident!.queued -= 1
    this.answerUnavailable(queued)
    for (const envelope of queued) this.restIfIdle(envelope.resident!)
  }

  /** One store call loads every user of `residents`; their commands go back to the front of the queue. */
  private load(residents: Array<Resident>, now: number): void {
    if (this.log.loadsBlocked()) {
      // An append of theirs failed and may have landed: not before the tables hold its outcome.
      this.loadsAfterCheckpoint.push(...residents)
      this.wake()
      return
    }
    const generation = this.generation
    this.reads += 1
    const call = this.settings.runFork(
      this.settings.store.loadUsers(
        residents.map((resident) => resident.user),
        now
      )
    )
    call.addObserver((exit) => {
      this.reads -= 1
      if (generation === this.generation && !this.closed) {
        try {
          this.loaded(residents, exit)
        } catch (cause) {
          // A loaded state that fails its invariants: a bug or a corrupt row, never decided from.
          this.settings.onError(residents[0]!.user, "load crashed (invariant violation or bug)", cause)
          this.dropEverything()
        }
      }
      this.wake()
    })
  }

  private loaded(
    residents: ReadonlyArray<Resident>,
    exit: Exit.Exit<ReadonlyMap<string, StoredUser>, StoreUnavailable>
  ): void {
    if (Exit.isFailure(exit)) reportStoreFailure(this.settings, residents[0]!.user, "load failed", exit.cause)
    const back: Array<Envelope> = []
    for (const resident of residents) {
      const waiting = resident.loadingFor ?? []
      resident.loadingFor = undefined
      const stored = Exit.isSuccess(exit) ? exit.value.get(resident.user) : undefined
      if (stored === undefined) {
        // Not loaded: its commands are answered `unavailable`, and the next one loads again.
        resident.queued -= waiting.length
        for (const envelope of waiting) answer(envelope, unavailable, this.settings.onError)
        this.restIfIdle(resident)
        continue
      }
      const state = userStateFromStored(resident.user, stored)
      assertUserState(state)
      resident.state = state
      this.schedule(resident, nextDeadline(this.settings.config, state))
      back.push(...waiting)
    }
    // Before anything queued since: each user's commands stay in arrival order.
    if (back.length > 0) this.inbox = back.concat(this.inbox)
  }

  /**
   * Asks the store first for what the batch's decisions read that memory does not hold: closed holds
   * and `adjust` ids a capped memory forgot, the past periods of a `usage_history`. False when nothing
   * is needed (the batch is decided at once).
   */
  private prefetch(batch: Batch): boolean {
    const reads: Array<Effect.Effect<void, StoreUnavailable>> = []
    /** A user the reads are of has changes not yet in the tables: they run after a checkpoint. */
    let readsDirtyUser = false
    const now = batch.decidedAt
    const { store, config } = this.settings
    for (const resident of batch.residents) {
      const state = resident.state!
      if (!state.idsForgotten) continue
      readsDirtyUser ||= this.log.isDirty(resident.lastPosition)
      const wanted = idsToRecall(
        state,
        batch.envelopes.filter((envelope) => envelope.resident === resident).map(({ command }) => command)
      )
      for (
        let from = 0;
        from < wanted.holds.length || from < wanted.adjustments.length;
        from += recallIdsMax
      ) {
        const ids = {
          holds: wanted.holds.slice(from, from + recallIdsMax),
          adjustments: wanted.adjustments.slice(from, from + recallIdsMax)
        }
        reads.push(
          Effect.map(store.recall(resident.user, ids, now), (recalled) => rememberRecalled(state, recalled))
        )
      }
    }
    for (const envelope of batch.envelopes) {
      const command = envelope.command
      if (command.op !== "usage_history") continue
      const meters = usageHistoryMeters(config, command)
      if ("status" in meters) continue
      readsDirtyUser ||= this.log.isDirty(envelope.resident!.lastPosition)
      // One more than asked: the current period's row may be among the newest.
      reads.push(
        Effect.map(
          store.pastUsage(
            command.user,
            meters.map(({ meter }) => meter),
            command.periods + 1
          ),
          (past) => {
            envelope.command = { ...command, past }
          }
        )
      )
    }
    if (reads.length === 0) return false
    // The tables hold every change of the users read once a checkpoint brought their appends in (a
    // hold closed and forgotten a moment ago, a period that ended within the checkpoint interval).
    if (readsDirtyUser) {
      this.afterCheckpoint(
        () => {
          if (this.batch === batch) this.runPrefetch(batch, reads)
        },
        () => {
          // The checkpoint failed (or the partition let go, which answers the batch itself).
          if (this.batch !== batch || batch.outcome !== undefined) return
          batch.outcome = "failed"
          this.wake()
        }
      )
      return true
    }
    this.runPrefetch(batch, reads)
    return true
  }

  private runPrefetch(batch: Batch, reads: ReadonlyArray<Effect.Effect<void, StoreUnavailable>>): void {
    const call = this.settings.runFork(Effect.all(reads, { discard: true }))
    batch.call = call
    call.addObserver((exit) => {
      if (this.batch !== batch) return
      batch.call = undefined
      if (Exit.isFailure(exit))
        reportStoreFailure(this.settings, batch.residents[0]!.user, "prefetch failed", exit.cause)
      batch.outcome = Exit.isSuccess(exit) ? "prefetched" : "failed"
      this.wake()
    })
  }

  /** Decides the batch (synchronously), then writes it, or answers it at once when it wrote nothing. */
  private decideAndWrite(batch: Batch): void {
    batch.outcome = undefined
    if (!this.decide(batch)) {
      this.failBatch()
      return
    }
    if (batch.events.length === 0) {
      this.finishWritten(batch)
      return
    }
    if (this.log.full()) {
      // Checkpoints are behind (the store failing them): the tail stays bounded, nothing more is appended.
      this.settings.onError(
        "",
        `partition ${this.partition}: ${this.log.unprojectedRows()} appends wait for a checkpoint; refusing writes until it catches up`,
        undefined
      )
      this.failBatch()
      return
    }
    const { target, open } = this.log.take(this.partition, this.epoch!)
    batch.position = target.position
    const call = this.settings.runFork(this.settings.store.write(batch.events, target))
    batch.call = call
    call.addObserver((exit) => {
      if (Exit.isFailure(exit)) {
        this.log.failed(target.position, open)
        // Its outcome may have been a commit: the publisher reads the log from it (never counting it
        // published unread).
        this.settings.eventQueue?.appendFailed(this.partition, target.position)
      } else {
        this.log.confirmed(
          target.position,
          batch.events,
          this.settings.now(),
          open,
          this.settings.store.writesCheckpointed === true
        )
        // The log is the outbox: the row's events go to the partition's publisher from memory.
        this.settings.eventQueue?.appended(this.partition, {
          position: target.position,
          token: target.token,
          events: batch.events.filter((event): event is PublishedEvent => event.kind === "event")
        })
      }
      if (this.batch !== batch) return
      batch.call = undefined
      if (Exit.isFailure(exit))
        reportStoreFailure(this.settings, batch.residents[0]!.user, "write failed", exit.cause)
      batch.outcome = Exit.isSuccess(exit) ? "written" : "failed"
      this.wake()
    })
  }

  /**
   * `decideInto` for each command, in order, into the batch. Past the loop's turn (after at least one
   * decision) the rest go back to the front of the queue for the next batch. False (reported) when a
   * decision crashed: an invariant violation or a bug, never a wrong answer.
   */
  private decide(batch: Batch): boolean {
    const { settings } = this
    const now = settings.now()
    batch.decidedAt = now
    const ctx: DecideContext = { config: settings.config, now, random: settings.random }
    const output: Output = { events: batch.events, wakeups: [] }
    const options = { assertFull: settings.assertFull }
    const decideUntil = turnEndsAt()
    const { envelopes, replies } = batch
    let decided = 0
    try {
      for (; decided < envelopes.length; decided += 1) {
        if (decided > 0 && performance.now() >= decideUntil) break
        const envelope = envelopes[decided]!
        const result = decideInto(
          envelope.resident!.state!,
          envelope.command,
          ctx,
          output,
          options,
          handleOf(envelope)
        )
        for (const wakeup of output.wakeups) replies.push(envelopeOf(wakeup.reply), wakeup.result)
        output.wakeups.length = 0
        if (result !== null) replies.push(envelope, result)
        else if (envelope.command.op !== "acquire_slot") replies.push(envelope, { status: "ok" })
      }
    } catch (cause) {
      settings.onError(
        envelopes[decided]?.command.user ?? "",
        "decision crashed (invariant violation or bug)",
        cause
      )
      return false
    }
    if (decided < envelopes.length) {
      // Cut short by the turn: the rest are the next batch's, in their order.
      const rest = envelopes.splice(decided)
      for (const envelope of rest) envelope.resident!.queued += 1
      this.inbox = rest.concat(this.inbox)
    }
    // A period never goes back, across reloads too: the store learns the day the decisions reached.
    for (const resident of batch.residents) {
      const floor = periodFloorToStore(resident.state!)
      if (floor !== undefined) batch.events.push(floor)
    }
    return true
  }

  /** The batch is durable (or wrote nothing): its answers go out, in decision order. */
  private finishWritten(batch: Batch): void {
    const { settings } = this
    if (batch.events.length > 0) settings.onPersisted(batch.events)
    const { replies } = batch
    for (let index = 0; index < replies.length; index += 2) {
      const envelope = replies[index] as Envelope
      const result = replies[index + 1] as Result
      if (result.status === "busy" && envelope.resident?.state !== undefined)
        settings.metrics.slotBusy(planOf(settings.config, envelope.resident.state))
      answer(envelope, result, settings.onError)
    }
    this.batch = undefined
    for (const resident of batch.residents) {
      resident.inBatch = false
      resident.lastActiveAt = batch.decidedAt
      if (batch.position > 0) resident.lastPosition = batch.position
      if (resident.state !== undefined) {
        if (this.releasing) this.answerUnavailable(this.takeWaiters(resident))
        this.schedule(resident, nextDeadline(settings.config, resident.state))
      }
      this.restIfIdle(resident)
    }
  }

  /**
   * Nothing of the batch is confirmed: every command and every waiter it woke is answered
   * `unavailable`, and the users it touched forget their memory (their waiters answered `unavailable`
   * too: their place in the queue was memory only); the next command reloads from the store. Everything
   * is detached before the first answer: a reply that enqueues again reaches a user to be reloaded.
   */
  private failBatch(): void {
    const batch = this.batch
    if (batch === undefined) return
    this.batch = undefined
    const answered = this.batchEnvelopes(batch)
    for (const resident of batch.residents) {
      resident.inBatch = false
      answered.push(...this.takeWaiters(resident))
      resident.state = undefined
      // What fell due (an expiry the store refused: the outbox full, the write fenced) is tried again
      // after a pause, by a tick that reloads the user, not at once in a loop of loads and refusals. A
      // reload that fails lets the user go (its next command, or the orphan sweep, loads it again).
      this.schedule(resident, this.closed ? null : batch.decidedAt + failedWriteRetryDelayMs)
      this.restIfIdle(resident)
    }
    this.answerUnavailable(answered)
  }

  /** The batch's commands, then the waiters its decisions woke. */
  private batchEnvelopes(batch: Batch): Array<Envelope> {
    const envelopes = [...batch.envelopes]
    for (let index = 0; index < batch.replies.length; index += 2)
      envelopes.push(batch.replies[index] as Envelope)
    return envelopes
  }

  // ---------------------------------------------------------------------------------------------
  // Memory

  /** Takes the user's waiters out of its queue (their place in it was memory only), to be answered. */
  private takeWaiters(resident: Resident): Array<Envelope> {
    const state = resident.state
    if (state === undefined || state.waiters.length === 0) return []
    const waiters = state.waiters
    state.waiters = []
    return waiters.map((waiter) => envelopeOf(waiter.reply))
  }

  private answerUnavailable(envelopes: ReadonlyArray<Envelope>): void {
    for (const envelope of envelopes) answer(envelope, unavailable, this.settings.onError)
  }

  /**
   * Forgets every user and answers everything held `unavailable`, undecided, in arrival order: the
   * waiters parked by earlier batches, the batch in flight, the loads' commands, the queue. Used when
   * the partition is not served here, is served under a new epoch (lost and claimed again: memory may
   * be stale), is dropped, or the actor's own code crashed. A load in flight is discarded when it
   * returns; a batch's store call in flight is awaited before another batch (it is `abandoned`).
   */
  private dropEverything(): void {
    this.generation += 1
    // The log's tail stays in the store: the next open brings it into the tables before any load.
    this.log.reset()
    this.loadsAfterCheckpoint = []
    for (const resident of this.restAfterCheckpoint) resident.awaitingCheckpoint = false
    this.restAfterCheckpoint = []
    const waiting = this.checkpointWaiters
    this.checkpointWaiters = []
    for (const waiter of waiting) waiter.dropped()
    this.releaseOpenWaiters()
    const answered: Array<Envelope> = []
    for (const resident of this.users.values()) answered.push(...this.takeWaiters(resident))
    const batch = this.batch
    if (batch !== undefined) {
      answered.push(...this.batchEnvelopes(batch))
      if (batch.call === undefined) this.batch = undefined
      else batch.abandoned = true
    }
    for (const resident of this.users.values()) {
      answered.push(...(resident.loadingFor ?? []))
      resident.loadingFor = undefined
      resident.queued = 0
    }
    answered.push(...this.inbox)
    this.inbox = []
    for (const resident of [...this.users.values()]) {
      // A user of a batch whose call is still out stays until it is back (see `abandoned`).
      if (this.batch !== undefined && resident.inBatch) resident.state = undefined
      else {
        resident.inBatch = false
        this.settings.residency.evict(resident)
      }
    }
    this.answerUnavailable(answered)
  }

  /** At rest when nothing of it is queued or in flight: the residency may evict it (LRU). */
  private restIfIdle(resident: Resident): void {
    if (resident.queued > 0 || resident.inBatch || resident.loadingFor !== undefined) return
    if (this.users.get(resident.user) !== resident) return
    // Nothing to keep (its state is to be loaded again anyway), unless a retry is due for it.
    if (resident.state === undefined && resident.deadline === Infinity)
      this.settings.residency.evict(resident)
    else if (this.log.isDirty(resident.lastPosition)) {
      // Changes not yet in the tables: a load would miss them, so it stays until a checkpoint.
      if (!resident.awaitingCheckpoint) {
        resident.awaitingCheckpoint = true
        this.restAfterCheckpoint.push(resident)
      }
    } else this.settings.residency.rest(resident)
  }

  /** Ends a user's waits with `busy` (the residency evicts it: too many users at rest with waiters). */
  endWaitsBusy(resident: Resident): void {
    const state = resident.state
    if (state === undefined || state.waiters.length === 0) return
    const ctx: DecideContext = {
      config: this.settings.config,
      now: this.settings.now(),
      random: this.settings.random
    }
    const waiters = state.waiters
    state.waiters = []
    for (const waiter of waiters) {
      this.settings.metrics.slotBusy(planOf(this.settings.config, state))
      answer(envelopeOf(waiter.reply), busyResult(ctx, state), this.settings.onError)
    }
  }

  /** Evicted by the residency (idle): its deadline goes with it; the orphan sweep finds what falls due. */
  forgetDeadline(resident: Resident): void {
    this.deadlines.delete(resident)
    resident.deadline = Infinity
  }

  // ---------------------------------------------------------------------------------------------
  // Time

  private schedule(resident: Resident, deadline: number | null): void {
    const at = deadline ?? Infinity
    if (at === resident.deadline) return
    resident.deadline = at
    if (at === Infinity) this.deadlines.delete(resident)
    else this.deadlines.set(resident, at)
  }

  /**
   * Keeps one sleeping fiber until the earliest deadline, on Effect's clock (tests drive it with
   * TestClock); it only wakes the loop, which decides what fell due. Re-armed only when the earliest
   * deadline moves earlier than the one it sleeps until.
   */
  private armTimer(): void {
    const openAwaited =
      this.log.openedFor === undefined && (this.openWaiters.length > 0 || this.checkpointWaiters.length > 0)
    const at = Math.min(
      this.deadlines.peek()?.at ?? Infinity,
      Math.max(this.log.checkpointDueAt(), this.checkpointRetryAt),
      openAwaited && this.openRetryAt > this.settings.now() ? this.openRetryAt : Infinity
    )
    if (at >= this.timerAt && this.timer !== undefined) return
    if (at === Infinity) return
    const previous = this.timer
    this.timerAt = at
    // The wait is read when the fiber starts, not when it is forked: the clock may move in between.
    const { now } = this.settings
    const timer = this.settings.runFork(
      Effect.suspend(() => {
        const waitMs = at - now()
        return waitMs <= 0 ? Effect.void : Effect.sleep(waitMs)
      })
    )
    this.timer = timer
    timer.addObserver(() => {
      if (this.timer !== timer) return
      this.timer = undefined
      this.timerAt = Infinity
      this.wake()
    })
    previous?.interruptUnsafe()
  }
}
