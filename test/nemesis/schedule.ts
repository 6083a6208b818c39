/**
 * The nemesis's plan: from a seed, which fault starts when, on which process, for how long. Pure (no
 * clock, no IO), so a seed names one plan and a failing run is replayed by its seed (the timing of the
 * real processes is not replayed: as in Jepsen, the seed fixes what is done and when, not what the
 * scheduler of the machine does meanwhile).
 *
 * Each kind of fault starts at moments drawn from its own exponential gaps, so faults of different
 * kinds overlap freely: most bugs sit where two faults meet. Two rules keep a run meaningful:
 * a process has one fault of each resource at a time (one NATS fault, one Postgres reset, one pause or
 * kill...), and at most `disruptedMax` processes are cut off, paused or dead at once (the others serve,
 * so the load keeps going and every fault is met under load).
 */
import { makeRng } from "../../bench/lib/rng.js"

export const faultKinds = [
  "doubt",
  "memberLock",
  "natsReset",
  "natsSilent",
  "postgresReset",
  "pause",
  "kill",
  "clock",
  // Last: each kind draws from a stream of its own by its index, so the earlier kinds' plans stay.
  "postgresSilent",
  "standbyStall",
  "storeSilent",
  // The second round (issue 34): Postgres failed over and restarted, the NATS server restarted, every
  // lock lost at once, clocks up to and beyond the bound, a pause in a step-down.
  "promote",
  "postgresRestart",
  "natsRestart",
  "memberLockAll",
  "clockBeyond",
  "stepDownPause"
] as const

export type FaultKind = (typeof faultKinds)[number]

export interface FaultEvent {
  /** ms from the start of the faults. */
  readonly at: number
  readonly kind: FaultKind
  readonly member: number
  readonly durationMs: number
  /** doubt: share of commits that sleep; clock: the offset in ms; else 0. */
  readonly level: number
  /** doubt: how long a commit sleeps (past the query timeout); else 0. */
  readonly sleepMs: number
  /**
   * doubt: a storage stall instead: every COMMIT of the process waits until the fault ends, so those
   * begun more than the query timeout before its end time out at staggered moments, then all land.
   */
  readonly stall: boolean
  /** postgresSilent: the member-lock session is ended at the start (else it keeps forwarding). */
  readonly lockEnded: boolean
  /** postgresSilent: connections made during the silence pass (a stuck flow), else stay silent. */
  readonly newConnectionsPass: boolean
  /** storeSilent: ms after the silence began that the member lock is ended (else 0). */
  readonly lockAfterMs: number
  /**
   * storeSilent: how long the member lock stays lost (ended again each time it is taken) while the
   * ownership pool is silent too (so no heartbeat says the process lives: the others take over), else 0.
   */
  readonly lockLostMs: number
  /**
   * promote: how long the standby's link is silent before the primary is lost (0: no stall), so that
   * commits the standby never got were made visible on the primary (issue 34 item 1); else 0.
   */
  readonly stallMs: number
  /** promote: no primary for this long before the promotion; postgresRestart, natsRestart: down; else 0. */
  readonly downMs: number
  /**
   * promote: "in place" (pg_ctl promote) or "by restart"; postgresRestart: "crash" (the process group
   * killed) or "fast" (a fast shutdown); natsRestart: "kill" or "term"; else "".
   */
  readonly variant: string
}

interface KindPlan {
  /** Mean gap between two starts of this kind, anywhere in the cluster. */
  readonly meanGapMs: number
  readonly durationMs: readonly [number, number]
  /** The kinds that share a resource of a process never overlap on it. */
  readonly resource: string
  /** Cut off, paused or dead: counts against disruptedMax. */
  readonly disrupts: boolean
}

/**
 * `clock` offsets stay below this: item 4's bound (QUOTA_CLOCK_OFFSET_MAX_MS, 500 ms by default) stops
 * a process further off, and the nemesis checks what must hold within the bound. `clockBeyond` goes up
 * to and past the bound.
 */
export const clockOffsetMaxMs = 390

/** clockBeyond's offsets, as shares of the processes' bound: from just within it to three times it. */
const clockBeyondShares = [0.8, 3] as const

export const kindPlans: Readonly<Record<FaultKind, KindPlan>> = {
  // Commits sleep in COMMIT past the query timeout: their outcome is unknown to the process.
  doubt: { meanGapMs: 6_000, durationMs: [1_000, 8_000], resource: "doubt", disrupts: false },
  // The member lock's session ended, and ended again each time it is taken, for the duration.
  memberLock: { meanGapMs: 9_000, durationMs: [0, 3_000], resource: "lock", disrupts: false },
  natsReset: { meanGapMs: 14_000, durationMs: [1_000, 8_000], resource: "nats", disrupts: true },
  natsSilent: { meanGapMs: 14_000, durationMs: [1_000, 8_000], resource: "nats", disrupts: true },
  postgresReset: { meanGapMs: 14_000, durationMs: [1_000, 6_000], resource: "postgres", disrupts: true },
  pause: { meanGapMs: 14_000, durationMs: [300, 8_000], resource: "process", disrupts: true },
  kill: { meanGapMs: 25_000, durationMs: [500, 4_000], resource: "process", disrupts: true },
  clock: { meanGapMs: 8_000, durationMs: [2_000, 15_000], resource: "clock", disrupts: false },
  // Nothing passes on its store connections, nothing is reset; the member-lock session kept or ended.
  postgresSilent: { meanGapMs: 14_000, durationMs: [1_000, 6_000], resource: "postgres", disrupts: true },
  // The synchronous standby's link silent (the nemesis's own primary): every COMMIT of every process
  // waits, reads answer; the query timeout makes doubtful commits at staggered moments. One link for
  // the cluster: the resource is shared by all processes (see makeSchedule).
  standbyStall: { meanGapMs: 20_000, durationMs: [5_000, 15_000], resource: "standby", disrupts: false },
  // Item 2's window: the store pool's connections silent (requests in flight stuck until the query
  // timeout, holding the step-down), the ownership pool's and the member-lock session's passing, but
  // for a while inside it the member lock is ended and the ownership pool silent too (the others see
  // the process dead and take over), then both pass again: the others hand partitions back while the
  // step-down still waits.
  storeSilent: { meanGapMs: 20_000, durationMs: [8_000, 20_000], resource: "postgres", disrupts: true },
  // The primary lost and the synchronous standby promoted, every process's address moved to it, a new
  // standby made: durationMs is the link's silence before the loss when there is one (stallMs). The
  // pair is the cluster's: one failover, restart or stall at a time (the resource is shared).
  promote: { meanGapMs: 30_000, durationMs: [5_000, 15_000], resource: "standby", disrupts: false },
  // The primary stopped and started again (durationMs unused: downMs says how long it is away).
  postgresRestart: { meanGapMs: 30_000, durationMs: [500, 3_000], resource: "standby", disrupts: false },
  // The NATS server stopped and started again on the same port and store (downMs).
  natsRestart: { meanGapMs: 30_000, durationMs: [500, 3_000], resource: "natsServer", disrupts: false },
  // Every process's member-lock session ended at once (and again each time it is taken): what a
  // Postgres restart or a Patroni failover does to the locks, without the rest (issue 34 item 3).
  memberLockAll: { meanGapMs: 25_000, durationMs: [0, 1_500], resource: "lockAll", disrupts: false },
  // An offset near and beyond the bound: a process further off must answer for nothing.
  clockBeyond: { meanGapMs: 15_000, durationMs: [2_000, 10_000], resource: "clock", disrupts: true },
  // The member lock ended, and the process stopped (SIGSTOP) as it begins to step down, for longer than
  // a lease: the others take its partitions meanwhile (durationMs here in thousandths of a lease).
  stepDownPause: { meanGapMs: 25_000, durationMs: [1_200, 2_000], resource: "process", disrupts: true }
}

/** Resources of the cluster, not of one process: two faults on them never overlap, whatever member. */
const sharedResources: ReadonlySet<string> = new Set(["standby", "natsServer", "lockAll"])

/** The kinds that need a Postgres primary and standby of the nemesis's own. */
export const kindsOnOwnPostgres: ReadonlySet<FaultKind> = new Set([
  "standbyStall",
  "promote",
  "postgresRestart"
])

export interface ScheduleOptions {
  readonly seed: number
  /** Faults start within [0, faultsMs) and end by it. */
  readonly faultsMs: number
  readonly members: number
  readonly kinds: ReadonlyArray<FaultKind>
  readonly queryTimeoutMs: number
  /** At most this many processes cut off, paused or dead at once. */
  readonly disruptedMax: number
  /** Divides every mean gap: 2 means faults twice as often. */
  readonly intensity?: number
  /** The processes' QUOTA_CLOCK_OFFSET_MAX_MS (clockBeyond's offsets are shares of it); 500 by default. */
  readonly clockOffsetMaxMs?: number
  /** The processes' partition lease (stepDownPause's pause is 1.2-2 of it); 6 000 by default. */
  readonly leaseMs?: number
}

export const makeSchedule = (options: ScheduleOptions): Array<FaultEvent> => {
  const candidates: Array<FaultEvent> = []
  faultKinds.forEach((kind, kindIndex) => {
    if (!options.kinds.includes(kind)) return
    // A stream per kind: switching one kind off leaves the others' plans as they were.
    const random = makeRng(options.seed * 7_919 + kindIndex).next
    const plan = kindPlans[kind]
    const meanGapMs = plan.meanGapMs / (options.intensity ?? 1)
    const [shortest, longest] = plan.durationMs
    // stepDownPause's durations are in leases.
    const unitMs = kind === "stepDownPause" ? (options.leaseMs ?? 6_000) / 1_000 : 1
    for (let at = -Math.log(1 - random()) * meanGapMs; at < options.faultsMs;) {
      const durationMs = Math.round(
        Math.min((shortest + random() * (longest - shortest)) * unitMs, Math.max(0, options.faultsMs - at))
      )
      const member = Math.floor(random() * options.members)
      const sign = random() < 0.5 ? -1 : 1
      const boundMs = options.clockOffsetMaxMs ?? 500
      const [nearest, furthest] = clockBeyondShares
      const level =
        kind === "doubt"
          ? 0.2 + 0.8 * random()
          : kind === "clock"
            ? sign * Math.round(50 + random() * (clockOffsetMaxMs - 50))
            : kind === "clockBeyond"
              ? sign * Math.round(boundMs * (nearest + random() * (furthest - nearest)))
              : 0
      // Biased to just past the timeout: such a commit lands soon after the process gave up on it,
      // before a later load would have ended it.
      const sleepMs = kind === "doubt" ? Math.round(options.queryTimeoutMs + 20 + random() ** 2 * 2_500) : 0
      const stall = kind === "doubt" && random() < 0.5
      const lockEnded = kind === "postgresSilent" && random() < 0.5
      const newConnectionsPass = kind === "postgresSilent" && random() < 0.5
      const lockAfterMs = kind === "storeSilent" ? Math.round(200 + random() * 1_800) : 0
      const lockLostMs = kind === "storeSilent" ? Math.round(1_000 + random() * 1_500) : 0
      const stallMs = kind === "promote" && random() < 0.6 ? durationMs : 0
      const downMs =
        kind === "promote"
          ? Math.round(300 + random() * 1_700)
          : kind === "postgresRestart" || kind === "natsRestart"
            ? durationMs
            : 0
      const variant =
        kind === "promote"
          ? random() < 0.75
            ? "in place"
            : "by restart"
          : kind === "postgresRestart"
            ? random() < 0.5
              ? "crash"
              : "fast"
            : kind === "natsRestart"
              ? random() < 0.5
                ? "kill"
                : "term"
              : ""
      candidates.push({
        at: Math.round(at),
        ...{ kind, member, durationMs, level, sleepMs, stall, lockEnded, newConnectionsPass },
        ...{ lockAfterMs, lockLostMs, stallMs, downMs, variant }
      })
      at += -Math.log(1 - random()) * meanGapMs
    }
  })
  candidates.sort((left, right) => left.at - right.at || left.kind.localeCompare(right.kind))
  const accepted: Array<FaultEvent> = []
  const overlaps = (event: FaultEvent, other: FaultEvent) =>
    other.at < event.at + event.durationMs && event.at < other.at + other.durationMs + 500
  for (const event of candidates) {
    const plan = kindPlans[event.kind]
    const busy = accepted.some(
      (other) =>
        (other.member === event.member || sharedResources.has(plan.resource)) &&
        kindPlans[other.kind].resource === plan.resource &&
        overlaps(event, other)
    )
    if (busy) continue
    if (plan.disrupts) {
      const disrupted = new Set(
        accepted
          .filter((other) => kindPlans[other.kind].disrupts && overlaps(event, other))
          .map((other) => other.member)
      )
      disrupted.add(event.member)
      if (disrupted.size > options.disruptedMax) continue
    }
    accepted.push(event)
  }
  return accepted
}

/** "doubt,memberLock" -> the kinds; throws on an unknown name. */
export const parseKinds = (text: string | undefined): Array<FaultKind> => {
  if (text === undefined || text === "all") return [...faultKinds]
  return text.split(",").map((name) => {
    const kind = faultKinds.find((candidate) => candidate === name.trim())
    if (kind === undefined) throw new Error(`unknown fault kind ${name}; known: ${faultKinds.join(", ")}`)
    return kind
  })
}
