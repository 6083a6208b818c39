/**
 * "Every command is safe to retry with the same id/job/key" (PROTOCOL.md, errors): through the
 * Coordinator, a retry after the actor was dropped and the user reloaded from the store (a crash, or
 * idle eviction days later) answers what stands, and nothing is applied twice.
 */
import { afterEach, describe, expect, it } from "vitest"
import type { Command } from "../../src/domain/commands.js"
import { defaultConfig } from "../../src/domain/config.js"
import type { MemoryStore } from "../../src/store/MemoryStore.js"
import { makeMemoryStore } from "../../src/store/MemoryStore.js"
import type { CoordinatorHarness } from "../support/harness.js"
import { startCoordinator } from "../support/harness.js"

const user = "acme"

let harness: CoordinatorHarness | undefined
afterEach(async () => {
  await harness?.close()
  harness = undefined
})

interface RetryRow {
  readonly name: string
  readonly given: ReadonlyArray<Command>
  readonly command: Command
  readonly first: string
  readonly retried: string
  /** analysis used after the retry. */
  readonly used: number
  /** How the user is reloaded between the command and its retry. */
  readonly reload: "crash" | "a week idle"
}

const reserve: Command = { op: "reserve", user, meter: "analysis", amount: 30, id: "h1", ttlMs: 3_600_000 }
const rows: Array<RetryRow> = [
  {
    name: "reserve",
    given: [],
    command: reserve,
    first: "reserved",
    retried: "exists",
    used: 0,
    reload: "crash"
  },
  {
    name: "consume",
    given: [reserve],
    command: { op: "consume", user, id: "h1", amount: 10, key: "k1" },
    first: "consumed",
    retried: "exists",
    used: 10,
    reload: "crash"
  },
  {
    name: "commit",
    given: [reserve],
    command: { op: "commit", user, id: "h1", amount: 25 },
    first: "committed",
    retried: "exists",
    used: 25,
    reload: "crash"
  },
  {
    name: "release",
    given: [reserve],
    command: { op: "release", user, id: "h1" },
    first: "released",
    retried: "exists",
    used: 0,
    reload: "crash"
  },
  {
    name: "extend",
    given: [reserve],
    command: { op: "extend", user, id: "h1", ttlMs: 7_200_000 },
    first: "extended",
    retried: "extended",
    used: 0,
    reload: "crash"
  },
  {
    name: "adjust",
    given: [],
    command: { op: "adjust", user, meter: "analysis", amount: 40, id: "a1" },
    first: "adjusted",
    retried: "exists",
    used: 40,
    reload: "crash"
  },
  {
    name: "acquire_slot",
    given: [],
    command: { op: "acquire_slot", user, job: "j1", leaseMs: 120_000, waitMs: 0 },
    first: "acquired",
    retried: "exists",
    used: 0,
    reload: "crash"
  },
  {
    name: "release_slot",
    given: [{ op: "acquire_slot", user, job: "j1", leaseMs: 120_000, waitMs: 0 }],
    command: { op: "release_slot", user, job: "j1" },
    first: "released",
    retried: "not_found",
    used: 0,
    reload: "crash"
  },
  {
    name: "reserve of a committed hold, a week later",
    given: [reserve, { op: "commit", user, id: "h1", amount: undefined }],
    command: reserve,
    first: "closed",
    retried: "closed",
    used: 30,
    reload: "a week idle"
  },
  {
    name: "consume key of a committed hold, a week later",
    given: [
      reserve,
      { op: "consume", user, id: "h1", amount: 10, key: "k1" },
      { op: "commit", user, id: "h1", amount: 12 }
    ],
    command: { op: "consume", user, id: "h1", amount: 10, key: "k1" },
    first: "exists",
    retried: "exists",
    used: 12,
    reload: "a week idle"
  },
  {
    name: "adjust, a week later",
    given: [],
    command: { op: "adjust", user, meter: "analysis", amount: 40, id: "a1" },
    first: "adjusted",
    retried: "exists",
    used: 40,
    reload: "a week idle"
  }
]

const usedOf = async (coordinator: CoordinatorHarness): Promise<number> => {
  const usage = await coordinator.send({ op: "get_usage", user })
  if (usage.status !== "ok" || !("meters" in usage)) throw new Error(JSON.stringify(usage))
  return usage.meters.find((entry) => entry.meter === "analysis")!.used
}

describe("a retry after the user was reloaded answers what stands; nothing applied twice", () => {
  it.each(rows.map((row) => [`${row.name} (${row.reload})`, row] as const))("%s", async (_name, row) => {
    const store: MemoryStore = makeMemoryStore()
    // Starting on the 1st leaves a week inside one month, so `used` is comparable.
    harness = await startCoordinator({ config: defaultConfig, store, startAt: Date.UTC(2026, 2, 1) })
    const coordinator = harness
    for (const command of row.given) {
      expect((await coordinator.send(command)).status).not.toMatch(/invalid|unavailable|overloaded/)
    }
    expect((await coordinator.send(row.command)).status).toBe(row.first)
    if (row.reload === "crash") {
      store.fence()
      await coordinator.dropAllActors()
    } else {
      await coordinator.advance(7 * 86_400_000)
      expect(coordinator.coordinator.residentActors(), "the idle actor was evicted").toBe(0)
    }
    expect((await coordinator.send(row.command)).status).toBe(row.retried)
    expect(await usedOf(coordinator)).toBe(row.used)
    expect(store.duplicateLedgerKeys()).toBe(0)
  })
})
