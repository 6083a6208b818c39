/**
 * PROTOCOL.md's operations table for holds and usage, row by row, over the pure `decide`:
 * reserve, consume, commit, release, extend, adjust, and the edge cases settled for them.
 * Meter `analysis` has its limit set to 100 first unless a row says otherwise; ttl 60 s.
 */
import { describe, it } from "vitest"
import { defaultConfig } from "../../src/domain/config.js"
import type { Row } from "./support.js"
import {
  adjust,
  at,
  checkRow,
  commit,
  consume,
  extend,
  hold,
  holdResult,
  meter,
  release,
  reserve,
  setLimit,
  T0
} from "./support.js"

const limit100 = setLimit("analysis", 100)
const ttlEnd = T0 + 60_000

const reserveRows: Array<Row> = [
  {
    name: "reserved: the hold fits, used + reserved + amount <= limit",
    given: [limit100],
    when: reserve("h1", 30),
    then: holdResult("reserved", meter("analysis", 100, 0, 30), hold("h1", 30, 0, "pending", ttlEnd)),
    durable: true
  },
  {
    name: "reserved: exactly up to the limit",
    given: [limit100, reserve("h1", 60)],
    when: reserve("h2", 40),
    then: holdResult("reserved", meter("analysis", 100, 0, 100), hold("h2", 40, 0, "pending", ttlEnd)),
    durable: true
  },
  {
    name: "reserved: an amount of 0",
    given: [limit100],
    when: reserve("h1", 0),
    then: holdResult("reserved", meter("analysis", 100, 0, 0), hold("h1", 0, 0, "pending", ttlEnd)),
    durable: true
  },
  {
    name: "exists: the id is a pending hold with the same meter and amount (the hold unchanged, ttl of the retry ignored)",
    given: [limit100, reserve("h1", 30)],
    when: at(5_000, reserve("h1", 30, "analysis", 3_600_000)),
    then: holdResult("exists", meter("analysis", 100, 0, 30), hold("h1", 30, 0, "pending", ttlEnd)),
    durable: false
  },
  {
    name: "conflict: same id, another amount (carries the existing hold)",
    given: [limit100, reserve("h1", 30)],
    when: reserve("h1", 31),
    then: holdResult("conflict", meter("analysis", 100, 0, 30), hold("h1", 30, 0, "pending", ttlEnd)),
    durable: false
  },
  {
    name: "conflict: same id, another meter (carries the existing hold and its meter's state)",
    given: [limit100, reserve("h1", 30)],
    when: reserve("h1", 30, "tokens"),
    then: holdResult("conflict", meter("analysis", 100, 0, 30), hold("h1", 30, 0, "pending", ttlEnd)),
    durable: false
  },
  {
    name: "closed: the id was committed (whatever the other fields)",
    given: [limit100, reserve("h1", 30), commit("h1")],
    when: reserve("h1", 99, "tokens"),
    then: holdResult("closed", meter("analysis", 100, 30, 0), hold("h1", 30, 30, "committed", ttlEnd)),
    durable: false
  },
  {
    name: "closed: the id was released",
    given: [limit100, reserve("h1", 30), release("h1")],
    when: reserve("h1", 30),
    then: holdResult("closed", meter("analysis", 100, 0, 0), hold("h1", 30, 0, "released", ttlEnd)),
    durable: false
  },
  {
    name: "closed: the id expired",
    given: [limit100, reserve("h1", 30, "analysis", 1_000)],
    when: at(1_000, reserve("h1", 30)),
    then: holdResult("closed", meter("analysis", 100, 0, 0), hold("h1", 30, 0, "expired", T0 + 1_000)),
    durable: true
  },
  {
    name: "insufficient_quota: carries requested and pendingHolds (work in progress, not out of quota)",
    given: [limit100, reserve("h1", 60), reserve("h2", 30)],
    when: reserve("h3", 20),
    then: { status: "insufficient_quota", requested: 20, pendingHolds: 2, ...meter("analysis", 100, 0, 90) },
    durable: false
  },
  {
    name: "insufficient_quota: used counts as well as reserved",
    given: [limit100, adjust("a1", 95)],
    when: reserve("h1", 6),
    then: { status: "insufficient_quota", requested: 6, pendingHolds: 0, ...meter("analysis", 100, 95, 0) },
    durable: false
  },
  {
    name: "insufficient_quota: a meter the plan does not list has limit 0",
    config: {
      ...defaultConfig,
      plans: { ...defaultConfig.plans, free: { slots: 1, limits: { analysis: 10 } } }
    },
    when: reserve("h1", 1, "tokens"),
    then: { status: "insufficient_quota", requested: 1, pendingHolds: 0, ...meter("tokens", 0, 0, 0) },
    durable: false
  },
  {
    name: "unknown_meter: a well-formed name that is not configured",
    given: [limit100],
    when: reserve("h1", 1, "nope"),
    then: { status: "unknown_meter" },
    durable: false
  },
  {
    name: "the id decides first: a pending id with an unknown meter is conflict, not unknown_meter",
    given: [limit100, reserve("h1", 30)],
    when: reserve("h1", 30, "nope"),
    then: holdResult("conflict", meter("analysis", 100, 0, 30), hold("h1", 30, 0, "pending", ttlEnd)),
    durable: false
  },
  {
    name: "the id decides first: a closed id over the limit is closed, not insufficient_quota",
    given: [limit100, reserve("h1", 30), release("h1"), adjust("a1", 100)],
    when: reserve("h1", 30),
    then: holdResult("closed", meter("analysis", 100, 100, 0), hold("h1", 30, 0, "released", ttlEnd)),
    durable: false
  },
  {
    name: "the default limit is the plan's: free analysis 5 000",
    when: reserve("h1", 5_001),
    then: {
      status: "insufficient_quota",
      requested: 5_001,
      pendingHolds: 0,
      ...meter("analysis", 5_000, 0, 0)
    },
    durable: false
  }
]

const consumeRows: Array<Row> = [
  {
    name: "consumed: moves the amount from the hold into usage now",
    given: [limit100, reserve("h1", 30)],
    when: consume("h1", 10, "k1"),
    then: holdResult("consumed", meter("analysis", 100, 10, 20), hold("h1", 30, 10, "pending", ttlEnd)),
    durable: true
  },
  {
    name: "consumed: past the hold's amount it is usage all the same (within the limit: no overage)",
    given: [limit100, reserve("h1", 30), consume("h1", 20, "k1")],
    when: consume("h1", 20, "k2"),
    then: holdResult("consumed", meter("analysis", 100, 40, 0), hold("h1", 30, 40, "pending", ttlEnd)),
    durable: true
  },
  {
    name: "consumed: past the hold and the limit, it shows as overage",
    given: [setLimit("analysis", 30), reserve("h1", 30)],
    when: consume("h1", 50, "k1"),
    then: holdResult("consumed", meter("analysis", 30, 50, 0), hold("h1", 30, 50, "pending", ttlEnd)),
    durable: true
  },
  {
    name: "exists: this key was already applied (nothing applied twice)",
    given: [limit100, reserve("h1", 30), consume("h1", 10, "k1")],
    when: consume("h1", 10, "k1"),
    then: holdResult("exists", meter("analysis", 100, 10, 20), hold("h1", 30, 10, "pending", ttlEnd)),
    durable: false
  },
  {
    name: "exists: an applied key answers exists even after the hold closed",
    given: [limit100, reserve("h1", 30), consume("h1", 10, "k1"), commit("h1")],
    when: consume("h1", 10, "k1"),
    then: holdResult("exists", meter("analysis", 100, 30, 0), hold("h1", 30, 30, "committed", ttlEnd)),
    durable: false
  },
  {
    name: "closed: a new key on a committed hold",
    given: [limit100, reserve("h1", 30), commit("h1")],
    when: consume("h1", 10, "k2"),
    then: holdResult("closed", meter("analysis", 100, 30, 0), hold("h1", 30, 30, "committed", ttlEnd)),
    durable: false
  },
  {
    name: "closed: a new key on an expired hold",
    given: [limit100, reserve("h1", 30, "analysis", 1_000)],
    when: at(2_000, consume("h1", 10, "k1")),
    then: holdResult("closed", meter("analysis", 100, 0, 0), hold("h1", 30, 0, "expired", T0 + 1_000)),
    durable: true
  },
  {
    name: "not_found: no such hold",
    given: [limit100],
    when: consume("h9", 10, "k1"),
    then: { status: "not_found" },
    durable: false
  }
]

const commitRows: Array<Row> = [
  {
    name: "committed: default amount is the hold's amount when nothing more was consumed",
    given: [limit100, reserve("h1", 30)],
    when: commit("h1"),
    then: holdResult("committed", meter("analysis", 100, 30, 0), hold("h1", 30, 30, "committed", ttlEnd)),
    durable: true
  },
  {
    name: "committed: default amount is max(amount, consumed) (consumed past the hold)",
    given: [limit100, reserve("h1", 30), consume("h1", 45, "k1")],
    when: commit("h1"),
    then: holdResult("committed", meter("analysis", 100, 45, 0), hold("h1", 30, 45, "committed", ttlEnd)),
    durable: true
  },
  {
    name: "committed: below the estimate refunds (usage becomes exactly the amount, counting consumed)",
    given: [limit100, reserve("h1", 30), consume("h1", 20, "k1")],
    when: commit("h1", 5),
    then: holdResult("committed", meter("analysis", 100, 5, 0), hold("h1", 30, 5, "committed", ttlEnd)),
    durable: true
  },
  {
    name: "committed: between consumed and the estimate charges only the difference; the rest is returned",
    given: [limit100, reserve("h1", 30), consume("h1", 20, "k1")],
    when: commit("h1", 25),
    then: holdResult("committed", meter("analysis", 100, 25, 0), hold("h1", 30, 25, "committed", ttlEnd)),
    durable: true
  },
  {
    name: "committed: above the estimate charges (overage past the limit)",
    given: [limit100, reserve("h1", 30), adjust("a1", 60)],
    when: commit("h1", 50),
    then: holdResult("committed", meter("analysis", 100, 110, 0), hold("h1", 30, 50, "committed", ttlEnd)),
    durable: true
  },
  {
    name: "committed: 0 refunds everything consumed",
    given: [limit100, reserve("h1", 30), consume("h1", 30, "k1")],
    when: commit("h1", 0),
    then: holdResult("committed", meter("analysis", 100, 0, 0), hold("h1", 30, 0, "committed", ttlEnd)),
    durable: true
  },
  {
    name: "exists: already committed, the same result again (another amount changes nothing)",
    given: [limit100, reserve("h1", 30), commit("h1", 25)],
    when: commit("h1", 99),
    then: holdResult("exists", meter("analysis", 100, 25, 0), hold("h1", 30, 25, "committed", ttlEnd)),
    durable: false
  },
  {
    name: "closed: released",
    given: [limit100, reserve("h1", 30), release("h1")],
    when: commit("h1"),
    then: holdResult("closed", meter("analysis", 100, 0, 0), hold("h1", 30, 0, "released", ttlEnd)),
    durable: false
  },
  {
    name: "closed: expired (the consumed part stays used)",
    given: [limit100, reserve("h1", 30, "analysis", 1_000), consume("h1", 10, "k1")],
    when: at(1_000, commit("h1")),
    then: holdResult("closed", meter("analysis", 100, 10, 0), hold("h1", 30, 10, "expired", T0 + 1_000)),
    durable: true
  },
  {
    name: "not_found",
    when: commit("h9"),
    then: { status: "not_found" },
    durable: false
  }
]

const releaseRows: Array<Row> = [
  {
    name: "released: the unconsumed rest is returned; consumed usage stays",
    given: [limit100, reserve("h1", 30), consume("h1", 10, "k1")],
    when: release("h1"),
    then: holdResult("released", meter("analysis", 100, 10, 0), hold("h1", 30, 10, "released", ttlEnd)),
    durable: true
  },
  {
    name: "exists: already released",
    given: [limit100, reserve("h1", 30), release("h1")],
    when: release("h1"),
    then: holdResult("exists", meter("analysis", 100, 0, 0), hold("h1", 30, 0, "released", ttlEnd)),
    durable: false
  },
  {
    name: "closed: committed",
    given: [limit100, reserve("h1", 30), commit("h1")],
    when: release("h1"),
    then: holdResult("closed", meter("analysis", 100, 30, 0), hold("h1", 30, 30, "committed", ttlEnd)),
    durable: false
  },
  {
    name: "closed: expired",
    given: [limit100, reserve("h1", 30, "analysis", 1_000)],
    when: at(1_001, release("h1")),
    then: holdResult("closed", meter("analysis", 100, 0, 0), hold("h1", 30, 0, "expired", T0 + 1_000)),
    durable: true
  },
  {
    name: "not_found",
    when: release("h9"),
    then: { status: "not_found" },
    durable: false
  }
]

const extendRows: Array<Row> = [
  {
    name: "extended: new expiresAt = now + ttlMs",
    given: [limit100, reserve("h1", 30)],
    when: at(30_000, extend("h1", 120_000)),
    then: holdResult("extended", meter("analysis", 100, 0, 30), hold("h1", 30, 0, "pending", T0 + 150_000)),
    durable: true
  },
  {
    name: "extended: an extended hold does not expire at its old time",
    given: [limit100, reserve("h1", 30, "analysis", 1_000), at(500, extend("h1", 60_000))],
    when: at(1_000, reserve("h1", 30)),
    then: holdResult("exists", meter("analysis", 100, 0, 30), hold("h1", 30, 0, "pending", T0 + 60_500)),
    durable: false
  },
  {
    name: "extended: may shorten (now + ttlMs, whatever it was)",
    given: [limit100, reserve("h1", 30, "analysis", 3_600_000)],
    when: extend("h1", 1_000),
    then: holdResult("extended", meter("analysis", 100, 0, 30), hold("h1", 30, 0, "pending", T0 + 1_000)),
    durable: true
  },
  {
    name: "closed: committed",
    given: [limit100, reserve("h1", 30), commit("h1")],
    when: extend("h1", 60_000),
    then: holdResult("closed", meter("analysis", 100, 30, 0), hold("h1", 30, 30, "committed", ttlEnd)),
    durable: false
  },
  {
    name: "closed: expired (too late to extend)",
    given: [limit100, reserve("h1", 30, "analysis", 1_000)],
    when: at(1_000, extend("h1", 60_000)),
    then: holdResult("closed", meter("analysis", 100, 0, 0), hold("h1", 30, 0, "expired", T0 + 1_000)),
    durable: true
  },
  {
    name: "not_found",
    when: extend("h9", 60_000),
    then: { status: "not_found" },
    durable: false
  }
]

const adjustRows: Array<Row> = [
  {
    name: "adjusted: a direct charge (usage += amount)",
    given: [limit100],
    when: adjust("a1", 40),
    then: { status: "adjusted", id: "a1", ...meter("analysis", 100, 40, 0) },
    durable: true
  },
  {
    name: "adjusted: a refund (a deleted file)",
    given: [limit100, adjust("a1", 40)],
    when: adjust("a2", -15),
    then: { status: "adjusted", id: "a2", ...meter("analysis", 100, 25, 0) },
    durable: true
  },
  {
    name: "adjusted: never below 0",
    given: [limit100, adjust("a1", 10)],
    when: adjust("a2", -25),
    then: { status: "adjusted", id: "a2", ...meter("analysis", 100, 0, 0) },
    durable: true
  },
  {
    name: "adjusted: a positive adjust may take the meter over its limit (overage)",
    given: [limit100, reserve("h1", 30)],
    when: adjust("a1", 90),
    then: { status: "adjusted", id: "a1", ...meter("analysis", 100, 90, 30) },
    durable: true
  },
  {
    name: "exists: this id was seen with the same meter and amount (nothing applied twice)",
    given: [limit100, adjust("a1", 40)],
    when: adjust("a1", 40),
    then: { status: "exists", id: "a1", ...meter("analysis", 100, 40, 0) },
    durable: false
  },
  {
    name: "conflict: seen with another amount",
    given: [limit100, adjust("a1", 40)],
    when: adjust("a1", 41),
    then: { status: "conflict", id: "a1", ...meter("analysis", 100, 40, 0) },
    durable: false
  },
  {
    name: "conflict: seen with another meter (carries the first meter's state)",
    given: [limit100, adjust("a1", 40)],
    when: adjust("a1", 40, "tokens"),
    then: { status: "conflict", id: "a1", ...meter("analysis", 100, 40, 0) },
    durable: false
  },
  {
    name: "the id decides first: a seen id with an unknown meter is conflict",
    given: [limit100, adjust("a1", 40)],
    when: adjust("a1", 40, "nope"),
    then: { status: "conflict", id: "a1", ...meter("analysis", 100, 40, 0) },
    durable: false
  },
  {
    name: "hold ids and adjust ids are separate namespaces",
    given: [limit100, reserve("x", 30)],
    when: adjust("x", 5),
    then: { status: "adjusted", id: "x", ...meter("analysis", 100, 5, 30) },
    durable: true
  },
  {
    name: "unknown_meter",
    given: [limit100],
    when: adjust("a1", 5, "nope"),
    then: { status: "unknown_meter" },
    durable: false
  }
]

const week = 7 * 86_400_000

const retentionRows: Array<Row> = [
  {
    name: "a closed hold's id is remembered for at least 7 days: a retry then is still closed",
    given: [limit100, reserve("h1", 30), commit("h1")],
    when: at(week, reserve("h1", 30)),
    then: holdResult("closed", meter("analysis", 100, 30, 0), hold("h1", 30, 30, "committed", ttlEnd)),
    durable: false
  },
  {
    name: "its consume keys too: a retried key 7 days later is exists, not charged again",
    given: [limit100, reserve("h1", 30), consume("h1", 10, "k1"), release("h1")],
    when: at(week, consume("h1", 10, "k1")),
    then: holdResult("exists", meter("analysis", 100, 10, 0), hold("h1", 30, 10, "released", ttlEnd)),
    durable: false
  },
  {
    name: "an adjust id is remembered for at least 7 days",
    given: [limit100, adjust("a1", 40)],
    when: at(week, adjust("a1", 40)),
    then: { status: "exists", id: "a1", ...meter("analysis", 100, 40, 0) },
    durable: false
  }
]

describe.each([
  ["retention of ids", retentionRows],
  ["reserve", reserveRows],
  ["consume", consumeRows],
  ["commit", commitRows],
  ["release", releaseRows],
  ["extend", extendRows],
  ["adjust", adjustRows]
])("%s", (_op, rows) => {
  it.each(rows.map((row) => [row.name, row] as const))("%s", (_name, row) => {
    checkRow(row)
  })
})
