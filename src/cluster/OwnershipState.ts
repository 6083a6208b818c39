/**
 * What a process knows of its own partition ownership (which partitions, under which epochs, until
 * when it may answer for them, and why it may not), and what its ownership rounds are given. The rounds
 * themselves are in PartitionOwnership.ts; why a process cannot serve, in ServingAbility.ts.
 */
import { hostname } from "node:os"
import { randomUUID } from "node:crypto"
import { Deferred } from "effect"
import type { Effect } from "effect"
import type { Fence } from "../store/Fence.js"
import type { OwnershipQueries } from "../store/postgres/ownership.js"
import type { ClockOffsetState } from "./ClockOffset.js"
import { clockWithinBound } from "./ClockOffset.js"
import type { UnownedPartitions } from "./UnownedPartitions.js"
import { makeUnownedPartitions } from "./UnownedPartitions.js"

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
   * When (performance.now()) the member lock was last taken. A store that failed while the lock was
   * lost (a failover ends both) counts against the process only from then on: it served nothing
   * meanwhile, and giving up at once on the lock's return handed its partitions to the others.
   */
  memberLockHeldSince: number
  /**
   * Set when the member lock is held again after a loss (memberLockRegained): the next round claims
   * only this process's own rows. Every process loses its lock at once in a failover, and the first to
   * lock again would otherwise count the others out while their heartbeats are older than a lease (an
   * outage that long) and take their shares, which it then hands back to them one by one.
   */
  ownRowsOnlyNextClaim: boolean
  /**
   * Since when (performance.now()) this process cannot reach its transport (NATS), or undefined while
   * it can. Past the grace (OwnershipOptions.transportLossGraceMs) it cannot serve what it owns: a
   * round gives every partition up (steps down, releases the leases) and heartbeats as leaving, so the
   * others' fair shares cover them; back in touch, a round claims its share again.
   */
  transportDownSince: number | undefined
  /**
   * Since when (performance.now() of the last check that passed) this process's store has failed its
   * checks, once that has lasted the grace (ServingAbility.ts watchStore); undefined while it passes.
   * Loads and writes fail meanwhile (every command `unavailable`), so a round gives every partition up,
   * as for a transport loss; a check that passes again lets the next round claim.
   */
  storeFailedSince: number | undefined
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
  /** For each partition of steppingDown, since when (performance.now()) a step-down of it has run. */
  readonly steppingDownSince: Map<number, number>
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
   * The server the held lock was taken on (memberLock.ts); absent or null: the server the heartbeat
   * reaches. Recorded with the key: a lock taken before a failover says nothing on the new server.
   */
  readonly lockServer?: () => string | null
  /**
   * How long the transport may be unreachable before this process gives its partitions up (see
   * OwnershipState.transportDownSince). Absent: never (a process without a transport to lose).
   */
  readonly transportLossGraceMs?: number
  /**
   * The store's check: what a load goes through before it reads (the doubts of unknown outcome
   * settled), then a round trip on the store's pool. Failing or unanswered for servingLossGraceMs, the
   * process gives its partitions up (OwnershipState.storeFailedSince). Absent: never checked.
   */
  readonly checkStore?: Effect.Effect<void, unknown>
  /** Told when the clock goes beyond the bound (with why) or comes back within it (undefined). */
  readonly onClockChange?: (beyond: string | undefined) => void
  /** Told when the store starts failing its checks past the grace (with why) or passes again (undefined). */
  readonly onStoreChange?: (failed: string | undefined) => void
  /**
   * How often to look for members known dead (their lock gone) that still hold leases; finding one
   * wakes the round at once. 0 or absent: only at each round.
   */
  readonly deathCheckIntervalMs?: number
}

/** The part of the lease a process counts on locally; the rest absorbs scheduling delays. */
export const servableShareOfLease = 0.8

/** The end of a partition's local deadline on both clocks (see OwnershipState.servableUntil). */
export interface ServableUntil {
  readonly monotonicMs: number
  readonly wallMs: number
}

/** Moments a request was sent, on both clocks: a deadline counts from before the database's lease began. */
export interface SentAt {
  readonly monotonicMs: number
  readonly wallMs: number
}

export const sentNow = (): SentAt => ({ monotonicMs: performance.now(), wallMs: Date.now() })

export const servableFrom = (sent: SentAt, forMs: number): ServableUntil => ({
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
    steppingDownSince: new Map(),
    servable,
    servingEpoch: (partition) => (servable(partition) ? epochs.get(partition) : undefined),
    memberLockHeld: true,
    memberLockLosses: 0,
    memberLockHeldSince: performance.now(),
    ownRowsOnlyNextClaim: false,
    transportDownSince: undefined,
    storeFailedSince: undefined,
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
