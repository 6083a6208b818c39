/**
 * Scaling out: processes sharing one NATS and one Postgres split the P partitions between them.
 *
 * Each round (every `renewIntervalMs`, or at once when woken) a process heartbeats, reads the live
 * members, and computes how many partitions it should hold (P/n, see shareCount). It renews the leases
 * it holds (any it lost are stepped down from), hands off what is beyond its count (stop taking their
 * messages, answer what is in flight, drop their actors, release the lease), and claims free
 * partitions (lease run out, released, or held by a member known dead) up to its count, the ones it
 * prefers first (preferenceOf). A survivor therefore keeps every partition it holds when a member dies.
 *
 * Leases only decide who should serve. Safety comes from the epoch: a claim bumps it, and every write
 * batch checks its epochs in the same transaction (src/store/postgres/writeEvents.ts), so a process
 * that paused past its lease fails its writes and grants nothing. See docs/SCALING.md.
 */
import { hostname } from "node:os"
import { randomUUID } from "node:crypto"
import { Cause, Deferred, Effect, Exit } from "effect"
import type { Fence } from "../store/Fence.js"
import type { OwnershipQueries } from "../store/postgres/ownership.js"
import { fnv1a32OfString } from "../domain/partition.js"
import type { ClockOffsetState } from "./ClockOffset.js"
import { clockBeyondReason, clockWithinBound, measureClockOffset } from "./ClockOffset.js"
import type { UnownedPartitions } from "./UnownedPartitions.js"
import { makeUnownedPartitions, recordUnowned } from "./UnownedPartitions.js"

export interface OwnershipState {
  readonly owner: string
  /** partition -> epoch this process holds it under. */
  readonly epochs: Map<number, number>
  /**
   * partition -> until when this process may answer for it: when its last successful renewal or claim
   * was sent, plus most of the lease. The database's lease began no earlier, so past this moment
   * another process may own it; a process that was paused finds its time passed and answers
   * `unavailable` instead of deciding from memory that may be stale. Read on two clocks, and both
   * must agree: the monotonic one (performance.now()) is immune to wall-clock steps but stands still
   * while the machine is suspended; the wall clock (Date.now()) runs on through a suspend.
   */
  readonly servableUntil: Map<number, ServableUntil>
  /**
   * Whether this process holds its member lock (src/store/postgres/memberLock.ts). Once the lock's
   * session has ended, the others may claim every partition of this process at once, so it answers
   * for none (servable is false), steps down from all, and claims nothing until the lock is held again.
   */
  memberLockHeld: boolean
  /** Counts member-lock losses: a claim sent before a loss and answered after it is handed back. */
  memberLockLosses: number
  /**
   * Since when (performance.now()) this process cannot reach its transport (NATS), or undefined while
   * it can. Past the grace (OwnershipOptions.transportLossGraceMs) it cannot serve what it owns: a
   * round gives every partition up (steps down, releases the leases) and heartbeats as leaving, so the
   * others' fair shares cover them; back in touch, a round claims its share again.
   */
  transportDownSince: number | undefined
  /**
   * This process's clock against Postgres's (src/cluster/ClockOffset.ts); undefined: not checked
   * (tests of other things). While beyond the bound it answers for no partition (servable is false at
   * once, a wall-clock step included) and its rounds give every partition up, as a transport loss.
   */
  readonly clock: ClockOffsetState | undefined
  /** Partitions a write found superseded: stepped down from at once (the round is woken). */
  readonly superseded: Set<number>
  /**
   * Partitions whose step-down is still running (the transport waits for their requests in flight,
   * then their actors are dropped), with how many step-downs of each run. Not claimed until it ends: a
   * claim must never meet memory or queued writes from before it.
   */
  readonly steppingDown: Map<number, number>
  /** Partitions no process held at this process's last rounds, and since when (see UnownedPartitions). */
  readonly unowned: UnownedPartitions
  readonly fence: Fence
  /** Whether this process may decide for `partition` now. */
  readonly servable: (partition: number) => boolean
  /**
   * The epoch under which this process may decide for `partition` now, or undefined when it may not
   * (servable false). An actor records it before it loads and decides only while it is still the same
   * (src/actors/UserActor.ts): memory loaded under an earlier claim is never used under a later one.
   */
  readonly servingEpoch: (partition: number) => number | undefined
  /** Wakes the ownership loop for an immediate round (set by runOwnership). */
  wake: () => void
  /** Set by leaveOwnership: the loop claims nothing more and ends after the round in flight. */
  leaving: boolean
  /** Whether runOwnership was started (leaveOwnership then waits for it to end). */
  loopStarted: boolean
  /** Completed when the ownership loop has ended. */
  readonly loopEnded: Deferred.Deferred<void>
}

/** The part of the lease a process counts on locally; the rest absorbs scheduling delays. */
export const servableShareOfLease = 0.8

/** The end of a partition's local deadline on both clocks (see OwnershipState.servableUntil). */
export interface ServableUntil {
  readonly monotonicMs: number
  readonly wallMs: number
}

/** Moments a request was sent, on both clocks: a deadline counts from before the database's lease began. */
interface SentAt {
  readonly monotonicMs: number
  readonly wallMs: number
}

const sentNow = (): SentAt => ({ monotonicMs: performance.now(), wallMs: Date.now() })

const servableFrom = (sent: SentAt, forMs: number): ServableUntil => ({
  monotonicMs: sent.monotonicMs + forMs,
  wallMs: sent.wallMs + forMs
})

export const makeOwnerId = (): string => `${hostname()}-${process.pid}-${randomUUID().slice(0, 8)}`

export const makeOwnershipState = (
  owner: string = makeOwnerId(),
  clock?: ClockOffsetState
): OwnershipState => {
  const epochs = new Map<number, number>()
  const servableUntil = new Map<number, ServableUntil>()
  const superseded = new Set<number>()
  const servable = (partition: number): boolean => {
    if (!state.memberLockHeld || !epochs.has(partition)) return false
    if (clock !== undefined && !clockWithinBound(clock)) {
      // A step seen between rounds: the round gives the partitions up now, not at its next turn.
      if (clock.beyond === undefined) state.wake()
      return false
    }
    const until = servableUntil.get(partition)
    return until !== undefined && performance.now() < until.monotonicMs && Date.now() < until.wallMs
  }
  const state: OwnershipState = {
    owner,
    epochs,
    servableUntil,
    superseded,
    clock,
    unowned: makeUnownedPartitions(),
    steppingDown: new Map(),
    servable,
    servingEpoch: (partition) => (servable(partition) ? epochs.get(partition) : undefined),
    memberLockHeld: true,
    memberLockLosses: 0,
    transportDownSince: undefined,
    wake: () => {},
    leaving: false,
    loopStarted: false,
    loopEnded: Deferred.makeUnsafe<void>(),
    fence: {
      owner,
      epochOf: (partition) => epochs.get(partition),
      superseded: (lost) => {
        // Stop writing and answering them at once, and step down now rather than next round.
        let stepped = false
        for (const { partition, epoch } of lost) {
          if (epochs.get(partition) !== epoch) continue
          epochs.delete(partition)
          servableUntil.delete(partition)
          superseded.add(partition)
          stepped = true
        }
        if (stepped) state.wake()
      }
    }
  }
  return state
}

export interface OwnershipOptions {
  readonly state: OwnershipState
  readonly queries: OwnershipQueries
  readonly partitions: number
  readonly leaseMs: number
  readonly renewIntervalMs: number
  /** Start taking the partitions' messages (subscribe). */
  readonly serve: (partitions: ReadonlyArray<number>) => Effect.Effect<void, unknown>
  /** Stop taking their messages, answer those in flight, drop their actors. */
  readonly stop: (partitions: ReadonlyArray<number>) => Effect.Effect<void>
  readonly log: (message: string, fields: Record<string, unknown>) => void
  /** The key of this process's advisory lock, recorded with its heartbeat (null: none held now). */
  readonly lockKey?: () => number | null
  /**
   * How long the transport may be unreachable before this process gives its partitions up (see
   * OwnershipState.transportDownSince). Absent: never (a process without a transport to lose).
   */
  readonly transportLossGraceMs?: number
  /** Told when the clock goes beyond the bound (with why) or comes back within it (undefined). */
  readonly onClockChange?: (beyond: string | undefined) => void
  /**
   * How often to look for members known dead (their lock gone) that still hold leases; finding one
   * wakes the round at once. 0 or absent: only at each round.
   */
  readonly deathCheckIntervalMs?: number
}

/**
 * How many partitions `owner` should hold among the live members: P/n rounded down, one more for the
 * first P mod n members in sorted order. Which partitions is not fixed by the members (as p mod n was):
 * each member keeps what it holds up to its count, hands off what is beyond it, and claims free
 * partitions up to it. So when a member dies or leaves, only its partitions move (every survivor's count
 * grows or stays), and when one joins, about P/n move to it (the others hand off what is beyond their
 * new counts). With p mod n over sorted members, a death also made the survivors swap partitions
 * between themselves, each a gap of up to a round for a partition whose owner was alive.
 */
export const shareCount = (owner: string, members: ReadonlyArray<string>, partitions: number): number => {
  const sorted = [...new Set([...members, owner])].sort()
  const index = sorted.indexOf(owner)
  return Math.floor(partitions / sorted.length) + (index < partitions % sorted.length ? 1 : 0)
}

/**
 * How much `owner` prefers `partition` (rendezvous hashing: a score per member and partition, each
 * member claiming its highest-scored free partitions first and handing off its lowest-scored ones):
 * members rarely reach for the same free partitions at once, and where they do, the claims' SKIP
 * LOCKED gives each a different one.
 */
export const preferenceOf = (owner: string, partition: number): number => {
  // FNV-1a, then murmur3's finalizer: FNV alone barely mixes the last characters into the high bits.
  let hash = fnv1a32OfString(`${partition}/${owner}`)
  hash = Math.imul(hash ^ (hash >>> 16), 0x85ebca6b)
  hash = Math.imul(hash ^ (hash >>> 13), 0xc2b2ae35)
  return (hash ^ (hash >>> 16)) >>> 0
}

/**
 * Stops serving `partitions` (their answers at once; subscriptions, requests in flight and actors as
 * `stop` goes). Until `stop` has ended they are in `steppingDown`, which no claim takes: the step-down
 * after a member-lock loss runs in a fiber of its own, and a round claiming meanwhile would otherwise
 * meet actors still resident from before the loss. Its end wakes the loop to claim again. The
 * bookkeeping is done when called, not when the returned effect runs (memberLockLost forks it).
 */
const stepDown = (
  options: OwnershipOptions,
  partitions: ReadonlyArray<number>,
  reason: string
): Effect.Effect<void> => {
  if (partitions.length === 0) return Effect.void
  const { state } = options
  for (const partition of partitions) {
    state.epochs.delete(partition)
    state.servableUntil.delete(partition)
    state.steppingDown.set(partition, (state.steppingDown.get(partition) ?? 0) + 1)
  }
  return options.stop(partitions).pipe(
    Effect.andThen(Effect.sync(() => options.log("stepped down from partitions", { partitions, reason }))),
    Effect.ensuring(
      Effect.sync(() => {
        for (const partition of partitions) {
          const running = (state.steppingDown.get(partition) ?? 1) - 1
          if (running > 0) state.steppingDown.set(partition, running)
          else state.steppingDown.delete(partition)
        }
        state.wake()
      })
    )
  )
}

/** Whether the transport has been unreachable for longer than the grace. */
const transportAway = (options: OwnershipOptions): boolean => {
  const since = options.state.transportDownSince
  return (
    options.transportLossGraceMs !== undefined &&
    since !== undefined &&
    performance.now() - since >= options.transportLossGraceMs
  )
}

/**
 * The transport went down (`up` false) or came back: recorded, and the loop woken when it matters (at
 * the end of the grace, if still down; at once when back, to claim again).
 */
export const transportChanged = (options: OwnershipOptions, up: boolean): void => {
  const { state } = options
  if (up) {
    if (state.transportDownSince === undefined) return
    state.transportDownSince = undefined
    state.wake()
    return
  }
  if (state.transportDownSince !== undefined) return
  const since = performance.now()
  state.transportDownSince = since
  const grace = options.transportLossGraceMs
  if (grace === undefined) return
  setTimeout(() => {
    if (state.transportDownSince === since) state.wake()
  }, grace).unref()
}

/**
 * Measures the clock's offset (when checked) and tells onClockChange of a change. Returns why the
 * process may not serve because of its clock, or undefined.
 */
const checkClock = (options: OwnershipOptions) =>
  Effect.gen(function* () {
    const clock = options.state.clock
    if (clock === undefined) return undefined
    yield* measureClockOffset(clock, options.queries.serverTimeMs())
    const beyond = clockBeyondReason(clock)
    if (beyond === undefined ? clock.beyond !== undefined : clock.beyond === undefined)
      options.onClockChange?.(beyond)
    clock.beyond = beyond
    return beyond
  })

/** One round of heartbeat, renew, hand-off and claim. */
export const ownershipRound = (options: OwnershipOptions) =>
  Effect.gen(function* () {
    const { state, queries, leaseMs } = options
    const superseded = [...state.superseded]
    state.superseded.clear()
    yield* stepDown(options, superseded, "a write found the epoch superseded")

    // Every partition gets a row (free) before any claim, and one unowned for longer than a lease says so.
    const unowned = yield* queries.surveyPartitions(options.partitions)
    const unownedTooLong = recordUnowned(state.unowned, unowned, leaseMs, performance.now())
    if (unownedTooLong.length > 0)
      options.log("partitions have had no owner for longer than a lease", { partitions: unownedTooLong })

    // Cut off from the transport, or a clock beyond the bound: nothing it owns can be served from here
    // (its time-based decisions could free a slot or expire a hold early), so the others take it.
    const clockBeyond = yield* checkClock(options)
    const away = transportAway(options) ? "cut off from the transport (NATS)" : clockBeyond
    if (away !== undefined) {
      yield* queries.heartbeat(state.owner, true, options.lockKey?.() ?? null)
      const held = new Map(state.epochs)
      if (held.size === 0) return
      yield* stepDown(options, [...held.keys()], away)
      yield* queries.release(state.owner, held)
      options.log(`released every partition: ${away}`, {
        partitions: [...held.keys()],
        ...(state.transportDownSince === undefined
          ? {}
          : { downForMs: Math.round(performance.now() - state.transportDownSince) })
      })
      return
    }

    // Members known dead (their lock gone) lose their partitions now, not when their leases run out.
    const dead = yield* queries.deadOwners()
    // Without its member lock this process claims nothing: it heartbeats as leaving, so that the
    // others' counts leave nothing for it (counted in, its share stayed free for as long as the loss).
    yield* queries.heartbeat(state.owner, !state.memberLockHeld, options.lockKey?.() ?? null)
    const members = yield* queries.liveMembers(leaseMs)
    const count = shareCount(state.owner, members, options.partitions)
    const byPreference = (left: number, right: number) =>
      preferenceOf(state.owner, left) - preferenceOf(state.owner, right)

    const servableFor = leaseMs * servableShareOfLease
    const renewSentAt = sentNow()
    const kept = yield* queries.renew(state.owner, state.epochs, leaseMs)
    // Only those still held: a member lock lost while the renewal was in flight stepped down from all.
    for (const partition of kept)
      if (state.epochs.has(partition))
        state.servableUntil.set(partition, servableFrom(renewSentAt, servableFor))
    yield* stepDown(
      options,
      [...state.epochs.keys()].filter((partition) => !kept.has(partition)),
      "the lease was taken over"
    )

    // Beyond its count (a member joined): the least preferred go to the members short of theirs.
    const beyond = [...state.epochs.keys()]
      .sort(byPreference)
      .slice(0, Math.max(0, state.epochs.size - count))
    const handOff = new Map(beyond.map((partition) => [partition, state.epochs.get(partition)!]))
    if (handOff.size > 0) {
      yield* stepDown(options, [...handOff.keys()], "rebalancing to another member")
      yield* queries.release(state.owner, handOff)
    }

    // Leaving: a claim now would hold a lease that nobody renews or serves. Without the member lock the
    // others take this process for dead and may claim whatever it holds at any moment.
    if (state.leaving || !state.memberLockHeld) return
    // A partition not yet stepped down from is not claimed: a fresh epoch over its actors still
    // resident would meet their memory from before it. Either a write found it superseded during this
    // round (the fence woke the loop, so the round that steps down comes next) or a step-down still runs
    // (after a member-lock loss: its end wakes the loop).
    const short = count - state.epochs.size
    if (short <= 0) return
    const wanted = Array.from({ length: options.partitions }, (_, partition) => partition)
      .filter(
        (partition) =>
          !state.epochs.has(partition) &&
          !state.superseded.has(partition) &&
          !state.steppingDown.has(partition)
      )
      .sort((left, right) => byPreference(right, left))
    const claimSentAt = sentNow()
    const lossesBefore = state.memberLockLosses
    // Its own rows among them too: a row this process owns but holds no epoch of is one it stepped down
    // from (a member-lock loss: after a failover every process's lock goes at once) or whose claim answer
    // it never heard. Nobody else may take such a row before its lease runs out, so waiting for that, or
    // for its old lock key to count as dead (not before the server has been up for the grace), left the
    // partition unserved; the claim bumps the epoch, which fences whatever it wrote under the old one.
    const claimed = yield* queries.claim(
      state.owner,
      wanted,
      leaseMs,
      [...new Set([...dead, state.owner])],
      short
    )
    if (claimed.size > 0 && (state.memberLockLosses !== lossesBefore || !state.memberLockHeld)) {
      // The member lock was lost while the claim was in flight: the others may already take these.
      yield* queries.release(state.owner, claimed)
      options.log("released partitions claimed while the member lock was lost", {
        partitions: [...claimed.keys()]
      })
      return
    }
    if (claimed.size > 0 && state.leaving) {
      // The leave began while this claim was in flight (it waited for this round at most a lease):
      // hand the leases straight back instead of serving partitions nobody will renew.
      yield* queries.release(state.owner, claimed)
      options.log("released partitions claimed while leaving", { partitions: [...claimed.keys()] })
      return
    }
    if (claimed.size > 0) {
      for (const [partition, epoch] of claimed) {
        state.epochs.set(partition, epoch)
        state.servableUntil.set(partition, servableFrom(claimSentAt, servableFor))
      }
      const partitions = [...claimed.keys()].sort((left, right) => left - right)
      // A claim counts only once its serving started (subscriptions flushed, publishers running): a
      // partition claimed but half served would be renewed by every later round and never served
      // properly (no publisher: its outbox fills and then every change that records an event is
      // refused). So a failed start is undone, the leases handed back, and a later round claims again.
      const served = yield* Effect.exit(options.serve(partitions))
      if (Exit.isFailure(served)) {
        yield* stepDown(options, partitions, "serving the claimed partitions failed")
        yield* queries.release(state.owner, claimed)
        options.log("serving claimed partitions failed: released them to be claimed again", {
          partitions,
          error: String(Cause.squash(served.cause))
        })
        return
      }
      options.log("claimed partitions", {
        partitions,
        members: members.length,
        ...(dead.length === 0 ? {} : { fromDeadMembers: dead })
      })
    }
  })

/**
 * The member lock's session ended: from now on the others may claim this process's partitions at any
 * moment (they take it for dead), and its memory of them may go stale without any write to fence. It
 * answers for none of them from this instant (servable reads memberLockHeld), steps down from every
 * one (subscriptions stopped, in-flight answered, actors dropped), and claims again only through a
 * normal round once the lock is held again (memberLockHeld set back by whoever holds the lock).
 */
export const memberLockLost = (options: OwnershipOptions, reason: string): Effect.Effect<void> => {
  // At once, not when the returned step-down runs: no answer from memory after this call.
  const { state } = options
  state.memberLockHeld = false
  state.memberLockLosses += 1
  return stepDown(options, [...state.epochs.keys()], reason)
}

/**
 * Looks for members known dead that still hold leases, every `intervalMs`; finding one wakes the
 * ownership round (each process computes its own share of what the dead one held). Ends with the loop.
 */
const watchForDeaths = (options: OwnershipOptions, intervalMs: number): Effect.Effect<void> =>
  Effect.gen(function* () {
    while (!options.state.leaving) {
      yield* Effect.sleep(intervalMs)
      const dead = yield* Effect.orElseSucceed(options.queries.deadOwners(), () => [])
      if (dead.length > 0) options.state.wake()
    }
  })

/**
 * Runs rounds until leaving (or interrupted); a failed round (Postgres away) is logged and retried next
 * round. A write that finds its epoch superseded wakes the loop for an immediate round, which steps down.
 */
export const runOwnership = (options: OwnershipOptions): Effect.Effect<void> =>
  Effect.gen(function* () {
    const { state } = options
    state.loopStarted = true
    let woken = Deferred.makeUnsafe<void>()
    state.wake = () => Deferred.doneUnsafe(woken, Exit.void)
    const deathCheckIntervalMs = options.deathCheckIntervalMs ?? 0
    if (deathCheckIntervalMs > 0) yield* Effect.forkChild(watchForDeaths(options, deathCheckIntervalMs))
    while (!state.leaving) {
      if (Deferred.isDoneUnsafe(woken)) woken = Deferred.makeUnsafe<void>()
      const round = yield* Effect.exit(ownershipRound(options))
      if (Exit.isFailure(round)) {
        options.log("ownership round failed", { error: String(Cause.squash(round.cause)) })
      }
      if (state.leaving) break
      yield* Effect.raceFirst(Effect.sleep(options.renewIntervalMs), Deferred.await(woken))
    }
  }).pipe(Effect.ensuring(Effect.sync(() => Deferred.doneUnsafe(options.state.loopEnded, Exit.void))))

/**
 * Graceful leave: stop the ownership loop (its round in flight finishes first, so a claim it sent is
 * known before the release), mark leaving, hand every partition off cleanly, release every lease this
 * owner holds, forget the member. Without the wait, a claim answered after the release left leases
 * nobody renewed, and their partitions unserved until the lease ran out. The wait is bounded by the
 * lease; a round still in flight after that releases what its claim took when the answer comes (see
 * ownershipRound), as long as the process lives to hear it.
 */
export const leaveOwnership = (options: OwnershipOptions) =>
  Effect.gen(function* () {
    const { state, queries } = options
    state.leaving = true
    if (state.loopStarted) {
      state.wake()
      // Bounded: a round stuck on an unreachable database must not hold the exit forever.
      yield* Effect.raceFirst(Deferred.await(state.loopEnded), Effect.sleep(options.leaseMs))
    }
    // Each step is tried whatever the one before did; a failure is logged (the leases then run out).
    const attempt = (step: string, effect: Effect.Effect<void, unknown>) =>
      Effect.flatMap(Effect.exit(effect), (exit) =>
        Effect.sync(() => {
          if (Exit.isFailure(exit))
            options.log(`leaving: ${step} failed`, { error: String(Cause.squash(exit.cause)) })
        })
      )
    yield* attempt("heartbeat", queries.heartbeat(state.owner, true))
    yield* stepDown(options, [...state.epochs.keys()], "leaving")
    yield* attempt("release", queries.releaseAll(state.owner))
    yield* attempt("forget member", queries.forgetMember(state.owner))
  })
