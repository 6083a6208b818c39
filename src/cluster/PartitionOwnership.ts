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
import { Cause, Deferred, Effect, Exit, Fiber } from "effect"
import { fnv1a32OfString } from "../domain/partition.js"
import { clockBeyondReason, measureClockOffset } from "./ClockOffset.js"
import type { OwnershipOptions, OwnershipState } from "./OwnershipState.js"
import { sentNow, servableFrom, servableShareOfLease } from "./OwnershipState.js"
import {
  givingUpReason,
  servingLossGraceMs,
  storeFailed,
  stuckStepDowns,
  transportAway,
  watchStore
} from "./ServingAbility.js"
import { recordUnowned } from "./UnownedPartitions.js"

export type { OwnershipOptions, OwnershipState, ServableUntil } from "./OwnershipState.js"
export { makeOwnerId, makeOwnershipState, servableShareOfLease } from "./OwnershipState.js"
export { transportChanged } from "./ServingAbility.js"

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
  const startedAt = performance.now()
  for (const partition of partitions) {
    state.epochs.delete(partition)
    state.servableUntil.delete(partition)
    state.steppingDown.set(partition, (state.steppingDown.get(partition) ?? 0) + 1)
    if (!state.steppingDownSince.has(partition)) state.steppingDownSince.set(partition, startedAt)
  }
  return options.stop(partitions).pipe(
    Effect.andThen(Effect.sync(() => options.log("stepped down from partitions", { partitions, reason }))),
    Effect.ensuring(
      Effect.sync(() => {
        for (const partition of partitions) {
          const running = (state.steppingDown.get(partition) ?? 1) - 1
          if (running > 0) state.steppingDown.set(partition, running)
          else {
            state.steppingDown.delete(partition)
            state.steppingDownSince.delete(partition)
          }
        }
        state.wake()
      })
    )
  )
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

/**
 * Heartbeats with the member lock only. Without it this process claims nothing, and its row speaks for
 * it as it stands: a lock taken on this server and now free says it is dead (the others take its share
 * at once); one taken on another server (a failover ended every session) leaves its heartbeat to speak
 * for up to a lease while it takes its lock again, so that the first process to lock again does not
 * count the others out. (It heartbeat as leaving before: after a failover the first back took every
 * partition and handed them back one by one.)
 */
const heartbeat = (options: OwnershipOptions, leaving: boolean) => {
  const { state } = options
  if (!state.memberLockHeld) return Effect.void
  return options.queries.heartbeat(
    state.owner,
    leaving,
    options.lockKey?.() ?? null,
    options.lockServer?.() ?? null
  )
}

/** The stuck step-downs last logged per process: logged when they change, not every round. */
const stuckReported = new WeakMap<OwnershipState, string>()

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

    // Cut off from the transport, a clock beyond the bound, a store that fails: nothing it owns can be
    // served from here (a clock off could free a slot or expire a hold early), so the others take it.
    const clockBeyond = yield* checkClock(options)
    const away = givingUpReason({
      transportAway: transportAway(options),
      clockBeyond,
      storeFailed: storeFailed(state, servingLossGraceMs(leaseMs), performance.now())
    })
    if (away !== undefined) {
      yield* heartbeat(options, true)
      const held = [...state.epochs.keys()]
      // The step-down starts now and the release runs beside it: the step-down waits for the requests
      // in flight, which a failed store holds, and the others' claims fence whatever those still write.
      // It runs to its end whatever the release does: a release failing with the store (likely, when
      // the store is why) must not leave the partitions booked as stepping down with nothing stopping
      // them (their subscriptions kept answering `unavailable`, and this process never claiming again).
      const stopping = yield* Effect.forkDetach(stepDown(options, held, away))
      const released = yield* Effect.exit(queries.releaseAll(state.owner))
      if (Exit.isSuccess(released) && held.length > 0)
        options.log(`released every partition: ${away}`, {
          partitions: held,
          ...(state.transportDownSince === undefined
            ? {}
            : { downForMs: Math.round(performance.now() - state.transportDownSince) })
        })
      yield* Fiber.join(stopping)
      if (Exit.isFailure(released)) return yield* Effect.failCause(released.cause)
      return
    }

    // A step-down that has run past the grace keeps this process from claiming those partitions back,
    // and the others, at their counts, would not either: it says it cannot take its share.
    const stuck = stuckStepDowns(state.steppingDownSince, performance.now(), servingLossGraceMs(leaseMs))
    yield* heartbeat(options, stuck.length > 0)
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
    if (stuck.length > 0) {
      // Counted out by the others from this heartbeat on; what it no longer serves is theirs to claim now.
      yield* queries.releaseUnserved(state.owner, [...state.epochs.keys()])
      if (stuckReported.get(state) !== stuck.join())
        options.log("not taking a share: step-downs still running, their leases released to the others", {
          partitions: stuck
        })
      stuckReported.set(state, stuck.join())
      return
    }
    stuckReported.delete(state)
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
    // Its own rows among them too, first: a row this process owns but holds no epoch of is one it
    // stepped down from (a member-lock loss: after a failover every process's lock goes at once) or
    // whose claim answer it never heard. Nobody else may take such a row before its lease runs out while
    // this process lives; the claim bumps the epoch, which fences whatever it wrote under the old one.
    // Right after the lock is held again, only those (see OwnershipState.ownRowsOnlyNextClaim).
    const ownRowsOnly = state.ownRowsOnlyNextClaim
    state.ownRowsOnlyNextClaim = false
    const claimed = yield* queries.claim(state.owner, wanted, leaseMs, short, ownRowsOnly)
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
      if (state.memberLockLosses !== lossesBefore || !state.memberLockHeld) {
        // The member lock was lost while their serving started: the loss's step-down ran before the
        // start ended and stopped nothing of it (subscriptions, publishers). Stopped now, and the leases
        // handed back: the others may take them at once. A publisher left running would be kept by the
        // next claim, its view of the log stale (rows appended by another owner meanwhile skipped).
        yield* stepDown(options, partitions, "the member lock was lost while serving them started")
        yield* queries.release(state.owner, claimed)
        options.log("released partitions claimed while the member lock was lost", { partitions })
        return
      }
      options.log("claimed partitions", {
        partitions,
        members: members.length,
        ...(ownRowsOnly ? { ownRowsOnly } : {})
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
 * The member lock is held (again): claims resume with the round this wakes, which takes only this
 * process's own rows when the lock had been lost (see OwnershipState.ownRowsOnlyNextClaim).
 */
export const memberLockRegained = (state: OwnershipState): void => {
  state.memberLockHeld = true
  state.memberLockHeldSince = performance.now()
  if (state.memberLockLosses > 0) state.ownRowsOnlyNextClaim = true
  state.wake()
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
    if (options.checkStore !== undefined) yield* Effect.forkChild(watchStore(options, options.checkStore))
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
