/**
 * PROTOCOL.md's slot operations, row by row, over the pure `decide`: acquire_slot (acquired, exists
 * with the lease renewed, busy with retryAfterMs, the FIFO wait), system jobs, renew_slot,
 * release_slot, plan changes, and FAIRNESS_ENABLED=false. Free plan: 1 slot; pro: 3; lease 120 s.
 */
import { describe, it } from "vitest"
import { defaultConfig } from "../../src/domain/config.js"
import type { Result } from "../../src/domain/results.js"
import type { Row } from "./support.js"
import { acquire, at, checkRow, getUsage, releaseSlot, renew, setPlan, T0, tick } from "./support.js"

const lease = T0 + 120_000
const waitFor = (job: string, waitMs = 60_000, leaseMs = 120_000) => acquire(job, { waitMs, leaseMs })
const fairnessOff = { ...defaultConfig, fairness: { ...defaultConfig.fairness, enabled: false } }

const acquireRows: Array<Row> = [
  {
    name: "acquired: a free slot",
    when: acquire("j1"),
    then: { status: "acquired", limit: 1, held: 1, leaseExpiresAt: lease },
    durable: true
  },
  {
    name: "acquired: leaseExpiresAt = now + leaseMs",
    when: at(7_000, acquire("j1", { leaseMs: 5_000 })),
    then: { status: "acquired", limit: 1, held: 1, leaseExpiresAt: T0 + 12_000 },
    durable: true
  },
  {
    name: "exists: this job already holds a slot; the lease is renewed",
    given: [acquire("j1")],
    when: at(60_000, acquire("j1", { leaseMs: 30_000 })),
    then: { status: "exists", limit: 1, held: 1, leaseExpiresAt: T0 + 90_000 },
    durable: true
  },
  {
    name: "busy: no slot free, no wait; retryAfterMs = snooze base 30 s + jitter (random 0)",
    given: [acquire("j1")],
    when: acquire("j2"),
    random: 0,
    then: { status: "busy", limit: 1, held: 1, retryAfterMs: 30_000 },
    durable: false
  },
  {
    name: "busy: retryAfterMs with random 0.5 is 35 s",
    given: [acquire("j1")],
    when: acquire("j2"),
    random: 0.5,
    then: { status: "busy", limit: 1, held: 1, retryAfterMs: 35_000 },
    durable: false
  },
  {
    name: "busy: retryAfterMs stays below 40 s (random just under 1)",
    given: [acquire("j1")],
    when: acquire("j2"),
    random: 0.999_999_9,
    then: { status: "busy", limit: 1, held: 1, retryAfterMs: 39_999 },
    durable: false
  },
  {
    name: "busy: with waiters queued, a caller that does not wait is busy",
    given: [acquire("j1"), waitFor("j2")],
    when: acquire("j3"),
    random: 0,
    then: { status: "busy", limit: 1, held: 1, retryAfterMs: 30_000 },
    durable: false
  },
  {
    name: "waits: no slot free and waitMs > 0 answers nothing yet",
    given: [acquire("j1")],
    when: waitFor("j2"),
    then: null,
    durable: false
  },
  {
    name: "FIFO: a released slot goes to the first waiter",
    given: [acquire("j1"), waitFor("j2"), waitFor("j3")],
    when: releaseSlot("j1"),
    then: { status: "released", limit: 1, held: 0 },
    wakes: { j2: { status: "acquired", limit: 1, held: 1, leaseExpiresAt: lease } },
    durable: true
  },
  {
    name: "FIFO: then to the next",
    given: [acquire("j1"), waitFor("j3"), waitFor("j2"), releaseSlot("j1")],
    when: at(1_000, releaseSlot("j3")),
    then: { status: "released", limit: 1, held: 0 },
    wakes: { j2: { status: "acquired", limit: 1, held: 1, leaseExpiresAt: lease + 1_000 } },
    durable: true
  },
  {
    name: "a repeat of a waiting job replaces the earlier request, answered busy at once (revision 1.2)",
    given: [acquire("j1"), waitFor("j2")],
    when: waitFor("j2"),
    random: 0,
    then: null,
    wakes: { j2: { status: "busy", limit: 1, held: 1, retryAfterMs: 30_000 } },
    durable: false
  },
  {
    name: "a repeat of a waiting job with waitMs 0: both requests busy, the job leaves the queue",
    given: [acquire("j1"), waitFor("j2"), waitFor("j3")],
    when: acquire("j2"),
    random: 0,
    then: { status: "busy", limit: 1, held: 1, retryAfterMs: 30_000 },
    wakes: { j2: { status: "busy", limit: 1, held: 1, retryAfterMs: 30_000 } },
    durable: false
  },
  {
    name: "a job whose repeat did not wait is no longer queued: the freed slot goes to the next",
    given: [acquire("j1"), waitFor("j2"), waitFor("j3"), acquire("j2")],
    when: releaseSlot("j1"),
    then: { status: "released", limit: 1, held: 0 },
    wakes: { j3: { status: "acquired", limit: 1, held: 1, leaseExpiresAt: lease } },
    durable: true
  },
  {
    name: "FIFO: a repeat of a waiting job keeps the job's place in the queue",
    given: [acquire("j1"), waitFor("j2"), waitFor("j3"), waitFor("j2")],
    when: releaseSlot("j1"),
    then: { status: "released", limit: 1, held: 0 },
    wakes: { j2: { status: "acquired", limit: 1, held: 1, leaseExpiresAt: lease } },
    durable: true
  },
  {
    name: "the repeat's own waitMs applies: a shorter one ends the wait sooner",
    given: [acquire("j1"), waitFor("j2", 10_000), at(1_000, waitFor("j2", 2_000))],
    when: at(3_000, tick()),
    random: 0,
    then: null,
    wakes: { j2: { status: "busy", limit: 1, held: 1, retryAfterMs: 30_000 } },
    durable: false
  },
  {
    name: "the repeat's own waitMs applies: a longer one waits past the first deadline",
    given: [acquire("j1"), waitFor("j2", 5_000), at(1_000, waitFor("j2", 10_000))],
    when: at(5_000, tick()),
    then: null,
    wakes: {},
    durable: false
  },
  {
    name: "the repeat's own leaseMs applies when the slot is handed over",
    given: [acquire("j1"), waitFor("j2", 60_000, 10_000), waitFor("j2", 60_000, 20_000)],
    when: releaseSlot("j1"),
    then: { status: "released", limit: 1, held: 0 },
    wakes: { j2: { status: "acquired", limit: 1, held: 1, leaseExpiresAt: T0 + 20_000 } },
    durable: true
  },
  {
    name: "the wait runs out: busy, with retryAfterMs",
    given: [acquire("j1"), waitFor("j2", 5_000)],
    when: at(5_000, tick()),
    random: 0,
    then: null,
    wakes: { j2: { status: "busy", limit: 1, held: 1, retryAfterMs: 30_000 } },
    durable: false
  },
  {
    name: "a lease that ends without renew_slot frees the slot for the next waiter",
    given: [acquire("j1", { leaseMs: 10_000 }), waitFor("j2")],
    when: at(10_000, tick()),
    then: null,
    wakes: { j2: { status: "acquired", limit: 1, held: 1, leaseExpiresAt: T0 + 130_000 } },
    durable: true
  },
  {
    name: "waiting up to waitMs: a lease ending as the wait runs out still hands over the slot",
    given: [acquire("j1", { leaseMs: 10_000 }), waitFor("j2", 10_000)],
    when: at(10_000, tick()),
    then: null,
    wakes: { j2: { status: "acquired", limit: 1, held: 1, leaseExpiresAt: T0 + 130_000 } },
    durable: true
  },
  {
    name: "pro plan: 3 slots",
    given: [setPlan("pro"), acquire("j1"), acquire("j2")],
    when: acquire("j3"),
    then: { status: "acquired", limit: 3, held: 3, leaseExpiresAt: lease },
    durable: true
  },
  {
    name: "pro plan: the 4th is busy",
    given: [setPlan("pro"), acquire("j1"), acquire("j2"), acquire("j3")],
    when: acquire("j4"),
    random: 0,
    then: { status: "busy", limit: 3, held: 3, retryAfterMs: 30_000 },
    durable: false
  },
  {
    name: "a plan with fewer slots takes nothing back: held 3 over limit 1, no new slot",
    given: [setPlan("pro"), acquire("j1"), acquire("j2"), acquire("j3"), setPlan("free")],
    when: acquire("j4"),
    random: 0,
    then: { status: "busy", limit: 1, held: 3, retryAfterMs: 30_000 },
    durable: false
  },
  {
    name: "a lowered plan: still no slot at held = limit",
    given: [
      setPlan("pro"),
      acquire("j1"),
      acquire("j2"),
      acquire("j3"),
      setPlan("free"),
      releaseSlot("j1"),
      releaseSlot("j2")
    ],
    when: acquire("j4"),
    random: 0,
    then: { status: "busy", limit: 1, held: 1, retryAfterMs: 30_000 },
    durable: false
  },
  {
    name: "a lowered plan: a slot again once under",
    given: [
      setPlan("pro"),
      acquire("j1"),
      acquire("j2"),
      setPlan("free"),
      releaseSlot("j1"),
      releaseSlot("j2")
    ],
    when: acquire("j4"),
    then: { status: "acquired", limit: 1, held: 1, leaseExpiresAt: lease },
    durable: true
  },
  {
    name: "a plan with more slots serves the queue at once",
    given: [acquire("j1"), waitFor("j2")],
    when: setPlan("pro"),
    then: { status: "ok" },
    wakes: { j2: { status: "acquired", limit: 3, held: 2, leaseExpiresAt: lease } },
    durable: true
  }
]

const systemRows: Array<Row> = [
  {
    name: "acquire_slot with an empty user (a system job): always acquired, limit null, held 0",
    when: acquire("nightly", { user: "" }),
    then: { status: "acquired", limit: null, held: 0, leaseExpiresAt: lease },
    durable: false
  },
  {
    name: "a system job counts against nothing (the user's only slot is taken)",
    given: [acquire("j1")],
    when: acquire("nightly", { user: "" }),
    then: { status: "acquired", limit: null, held: 0, leaseExpiresAt: lease },
    durable: false
  },
  {
    name: "renew_slot with an empty user: not_found",
    given: [acquire("nightly", { user: "" })],
    when: renew("nightly", 120_000, ""),
    then: { status: "not_found", limit: null, held: 0 },
    durable: false
  },
  {
    name: "release_slot with an empty user: not_found",
    given: [acquire("nightly", { user: "" })],
    when: releaseSlot("nightly", ""),
    then: { status: "not_found", limit: null, held: 0 },
    durable: false
  }
]

const renewReleaseRows: Array<Row> = [
  {
    name: "renew_slot renewed: leaseExpiresAt = now + leaseMs",
    given: [acquire("j1")],
    when: at(60_000, renew("j1", 30_000)),
    then: { status: "renewed", limit: 1, held: 1, leaseExpiresAt: T0 + 90_000 },
    durable: true
  },
  {
    name: "renew_slot not_found: not held",
    when: renew("j9"),
    then: { status: "not_found", limit: 1, held: 0 },
    durable: false
  },
  {
    name: "renew_slot not_found: the lease already ended",
    given: [acquire("j1", { leaseMs: 1_000 })],
    when: at(1_000, renew("j1")),
    then: { status: "not_found", limit: 1, held: 0 },
    durable: true
  },
  {
    name: "release_slot released",
    given: [acquire("j1")],
    when: releaseSlot("j1"),
    then: { status: "released", limit: 1, held: 0 },
    durable: true
  },
  {
    name: "release_slot not_found",
    given: [acquire("j1")],
    when: releaseSlot("j9"),
    then: { status: "not_found", limit: 1, held: 1 },
    durable: false
  },
  {
    name: "release_slot twice: not_found the second time",
    given: [acquire("j1"), releaseSlot("j1")],
    when: releaseSlot("j1"),
    then: { status: "not_found", limit: 1, held: 0 },
    durable: false
  }
]

const fairnessOffRows: Array<Row> = [
  {
    name: "FAIRNESS_ENABLED=false: every acquire_slot succeeds, limit null",
    config: fairnessOff,
    given: [acquire("j1"), acquire("j2")],
    when: acquire("j3"),
    then: { status: "acquired", limit: null, held: 3, leaseExpiresAt: lease },
    durable: true
  },
  {
    name: "FAIRNESS_ENABLED=false: get_usage shows slots.limit null",
    config: fairnessOff,
    given: [acquire("j1")],
    when: getUsage(),
    then: {
      status: "ok",
      plan: "free",
      meters: [
        ...["analysis", "specview"].map((name) => ({
          meter: name,
          period: "month",
          periodStart: Date.UTC(2026, 2, 1),
          limit: 5_000,
          used: 0,
          reserved: 0,
          available: 5_000,
          overage: 0,
          pendingHolds: 0
        })),
        {
          meter: "tokens",
          period: "month",
          periodStart: Date.UTC(2026, 2, 1),
          limit: 400_000,
          used: 0,
          reserved: 0,
          available: 400_000,
          overage: 0,
          pendingHolds: 0
        },
        {
          meter: "storage_bytes",
          period: "none",
          periodStart: null,
          limit: 1_000_000_000,
          used: 0,
          reserved: 0,
          available: 1_000_000_000,
          overage: 0,
          pendingHolds: 0
        }
      ],
      slots: { limit: null, held: 1, jobs: [{ job: "j1", leaseExpiresAt: lease }], waiting: 0 }
    } as Result,
    durable: false
  }
]

describe.each([
  ["acquire_slot", acquireRows],
  ["system jobs", systemRows],
  ["renew_slot and release_slot", renewReleaseRows],
  ["fairness off", fairnessOffRows]
])("%s", (_group, rows) => {
  it.each(rows.map((row) => [row.name, row] as const))("%s", (_name, row) => {
    checkRow(row)
  })
})
