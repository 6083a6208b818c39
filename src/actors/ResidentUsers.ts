/**
 * The users a process holds in memory, and their bounds. Each partition actor keeps its own users by
 * id (`ResidentHome.users`); the bounds are the process's, so one busy partition may use the room of idle
 * ones: `Residency` counts every resident user and keeps those at rest in two intrusive lists, least
 * recently used first: `idle` (nothing queued, no waiter: evicted freely to make room) and `waiting`
 * (slot waiters in their queue: only their waits' end lets them go). A user with commands queued, being
 * loaded, or in a batch being decided or written is in neither list and is never evicted.
 *
 * Users at rest with waiters are not counted by the resident cap but by a bound of their own (past it,
 * the one resting longest has its waits ended `busy`), so they cannot lock new users out (issue 20).
 */
import type { UserState } from "../domain/state.js"
import type { Envelope } from "./replies.js"
import type { RecencyLinks } from "./RecencyList.js"
import { RecencyList } from "./RecencyList.js"

/** One user in memory: its state once loaded, and what the partition actor tracks of it. */
export interface Resident extends RecencyLinks<Resident> {
  readonly user: string
  /** The user's state; undefined until loaded, and again after a failed write (the next command reloads). */
  state: UserState | undefined
  /** Commands that arrived while the state was being loaded, in arrival order (undefined: not loading). */
  loadingFor: Array<Envelope> | undefined
  /** Commands of this user taken and not yet decided (the inbox and `loadingFor`); bounded by mailboxCapacity. */
  queued: number
  /** In the batch being prefetched, decided or written: not evicted, and not at rest. */
  inBatch: boolean
  /** When it last decided something (Clock ms): idle eviction reads it. */
  lastActiveAt: number
  /** The deadline the partition's timer holds for it (Infinity: none). */
  deadline: number
  /** The log position of its last change (0: none since loaded); above the checkpoint, it is dirty. */
  lastPosition: number
  /** At rest but dirty: listed to be put at rest once a checkpoint makes it clean. */
  awaitingCheckpoint: boolean
  /** The residency's list that holds it while at rest; undefined otherwise. Only Residency writes it. */
  restingIn: RecencyList<Resident> | undefined
  /** The partition actor that holds it, so that the residency can take it out when it evicts it. */
  readonly home: ResidentHome
}

/** What the residency asks of the partition actor that holds a user. */
export interface ResidentHome {
  /** The partition's resident users by id. */
  readonly users: Map<string, Resident>
  /** The user leaves memory: its deadline goes with it (the orphan sweep finds what falls due). */
  readonly forgetDeadline: (resident: Resident) => void
  /** Too many users at rest with waiters: this one's waits end, each answered `busy`. */
  readonly endWaitsBusy: (resident: Resident) => void
}

export const makeResident = (user: string, home: ResidentHome, now: number): Resident => ({
  user,
  state: undefined,
  loadingFor: undefined,
  queued: 0,
  inBatch: false,
  lastActiveAt: now,
  deadline: Infinity,
  lastPosition: 0,
  awaitingCheckpoint: false,
  restingIn: undefined,
  home,
  newer: undefined,
  older: undefined
})

/** Waiters in a resident user's queue (0 before its state is loaded). */
export const waitersOf = (resident: Resident): number => resident.state?.waiters.length ?? 0

/** Nothing queued, no waiter, no batch, not loading: what idle eviction and the cap may take. */
export const isIdle = (resident: Resident): boolean =>
  resident.queued === 0 && !resident.inBatch && resident.loadingFor === undefined && waitersOf(resident) === 0

export interface ResidencyOptions {
  /** Resident users the cap counts (every one but those at rest with waiters). */
  readonly residentsMax: number
  /** Users at rest with waiters, apart from the cap. */
  readonly waitingMax: number
}

export class Residency {
  readonly idle = new RecencyList<Resident>()
  readonly waiting = new RecencyList<Resident>()
  /** Every resident user of every partition actor. */
  count = 0

  constructor(private readonly options: ResidencyOptions) {}

  /**
   * Room for one more user: evicts the least recently used idle one if the cap is reached. O(1). False
   * only when every user the cap counts is busy (queued, loading, in a batch), which ends by itself.
   */
  makeRoom(): boolean {
    if (this.count - this.waiting.size < this.options.residentsMax) return true
    const oldest = this.idle.oldest
    if (oldest === undefined) return false
    if (!isIdle(oldest)) throw new Error(`bug: ${oldest.user} is listed idle while not idle`)
    this.evict(oldest)
    return true
  }

  /** A new user is resident in its partition (after makeRoom). */
  admit(resident: Resident): void {
    resident.home.users.set(resident.user, resident)
    this.count += 1
  }

  /** Forgets a user: out of its partition's map and of the lists; its memory goes with it. */
  evict(resident: Resident): void {
    this.unrest(resident)
    const { users } = resident.home
    if (users.get(resident.user) === resident) {
      users.delete(resident.user)
      this.count -= 1
    }
    resident.home.forgetDeadline(resident)
    resident.state = undefined
  }

  /** The user has work again (a command queued, a batch): out of the resting lists. */
  unrest(resident: Resident): void {
    resident.restingIn?.remove(resident)
    resident.restingIn = undefined
  }

  /**
   * The user is at rest: the most recently used of its list. Past the bound of users at rest with
   * waiters, the one resting longest has its waits ended and is evicted.
   */
  rest(resident: Resident): void {
    this.unrest(resident)
    resident.restingIn = waitersOf(resident) === 0 ? this.idle : this.waiting
    resident.restingIn.touch(resident)
    while (this.waiting.size > this.options.waitingMax) {
      const oldest = this.waiting.oldest!
      oldest.home.endWaitsBusy(oldest)
      this.evict(oldest)
    }
  }

  /** Evicts the idle users whose last decision is `idleMs` old. Walks the idle list (0.5 ms per 100 000). */
  evictIdleSince(before: number): void {
    const due: Array<Resident> = []
    for (let resident = this.idle.oldest; resident !== undefined; resident = resident.newer) {
      if (resident.lastActiveAt <= before && isIdle(resident)) due.push(resident)
    }
    for (const resident of due) this.evict(resident)
  }
}
