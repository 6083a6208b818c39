/**
 * The seeds' races, replayed against the coordinator with real concurrency. Each scenario says what the
 * seed's system did and returns what the coordinator did, for `quota-coordinator demo` to print side by side.
 */

/** Sends one wire command (a plain object, as any language would) and resolves with its result. */
export type Call = (
  kind: "ops" | "admin",
  command: Record<string, unknown>
) => Promise<Record<string, unknown>>

export interface ScenarioOutcome {
  /** One line per thing the coordinator did. */
  readonly lines: ReadonlyArray<string>
  /** Whether the outcome is the one the protocol promises. */
  readonly held: boolean
}

export interface Scenario {
  readonly seed: string
  readonly title: string
  /** The race as the seed describes it. */
  readonly race: ReadonlyArray<string>
  readonly run: (call: Call, user: string) => Promise<ScenarioOutcome>
}

const statuses = (results: ReadonlyArray<Record<string, unknown>>): string =>
  results.map((result) => String(result["status"])).join(", ")

const count = (results: ReadonlyArray<Record<string, unknown>>, status: string): number =>
  results.filter((result) => result["status"] === status).length

const megabytes = 1_000_000

/** 280000 -> "280 000", as the seeds write numbers. */
const grouped = (value: unknown): string =>
  typeof value === "number" ? String(value).replace(/\B(?=(\d{3})+(?!\d))/g, " ") : String(value)

export const scenarios: ReadonlyArray<Scenario> = [
  {
    seed: "000/001 ADR-21 quota reservation (English, Korean)",
    title: "4 985 of 5 000 analyses used, two concurrent requests of 10",
    race: ["both check 4 985 + 10 <= 5 000 and pass", "both run: 5 005 used, over the limit"],
    run: async (call, user) => {
      await call("ops", { op: "adjust", user, meter: "analysis", amount: 4_985, id: "already-used" })
      const results = await Promise.all(
        ["request-a", "request-b"].map((id) =>
          call("ops", { op: "reserve", user, meter: "analysis", amount: 10, id })
        )
      )
      const reserved = count(results, "reserved")
      return {
        lines: [`concurrent reserves: ${statuses(results)}`, `holds granted: ${reserved} (limit allows 1)`],
        held: reserved === 1 && count(results, "insufficient_quota") === 1
      }
    }
  },
  {
    seed: "004 token reservation post-mortem",
    title: "400 000-token budget, three concurrent 350 000-token analyses",
    race: [
      "all three check 400 000 >= 350 000 and start: nothing in flight is counted",
      "25 minutes later all three are done: ~1 000 000 tokens used, 600 000 over the limit"
    ],
    run: async (call, user) => {
      const results = await Promise.all(
        ["analysis-a", "analysis-b", "analysis-c"].map((id) =>
          call("ops", { op: "reserve", user, meter: "tokens", amount: 350_000, id })
        )
      )
      const granted = results.find((result) => result["status"] === "reserved")
      const refused = results.filter((result) => result["status"] === "insufficient_quota")
      const lines = [
        `concurrent reserves: ${statuses(results)}`,
        `the refusals carry pendingHolds=${refused.map((result) => String(result["pendingHolds"])).join(", ")}: "an analysis is in progress", not "out of tokens"`
      ]
      if (granted === undefined) return { lines, held: false }
      const id = String(granted["id"])
      for (const [index, amount] of [100_000, 100_000, 80_000].entries()) {
        await call("ops", { op: "consume", user, id, amount, key: `step-${index}` })
      }
      const committed = await call("ops", { op: "commit", user, id, amount: 280_000 })
      lines.push(
        `consumed 100 000 + 100 000 + 80 000 as it ran, committed 280 000: used ${grouped(committed["used"])}, reserved ${grouped(committed["reserved"])}, available ${grouped(committed["available"])}`
      )
      return {
        lines,
        held:
          refused.length === 2 &&
          refused.every((result) => result["pendingHolds"] === 1) &&
          committed["status"] === "committed" &&
          committed["used"] === 280_000 &&
          committed["reserved"] === 0
      }
    }
  },
  {
    seed: "003 ADR-RM-3 per-tenant storage quota (Vietnamese)",
    title: "800 of 1 000 MB stored, concurrent uploads of 100 and 150 MB",
    race: [
      "both read 800 MB used and pass the check",
      "both write: 1 050 MB stored, over the 1 000 MB limit"
    ],
    run: async (call, user) => {
      await call("ops", {
        op: "adjust",
        user,
        meter: "storage_bytes",
        amount: 800 * megabytes,
        id: "existing-files"
      })
      const results = await Promise.all(
        [
          ["upload-100", 100],
          ["upload-150", 150]
        ].map(([id, size]) =>
          call("ops", { op: "reserve", user, meter: "storage_bytes", amount: Number(size) * megabytes, id })
        )
      )
      const granted = results.find((result) => result["status"] === "reserved")
      const lines = [`concurrent reserves: ${statuses(results)}`]
      if (granted === undefined) return { lines, held: false }
      const released = await call("ops", { op: "release", user, id: String(granted["id"]) })
      lines.push(
        `the granted upload failed and was released: available ${Number(released["available"]) / megabytes} MB`
      )
      const refund = await call("ops", {
        op: "adjust",
        user,
        meter: "storage_bytes",
        amount: -300 * megabytes,
        id: "delete-old-file"
      })
      lines.push(`a 300 MB file deleted, refunded with adjust: used ${Number(refund["used"]) / megabytes} MB`)
      return {
        lines,
        held:
          count(results, "reserved") === 1 &&
          released["status"] === "released" &&
          refund["used"] === 500 * megabytes
      }
    }
  },
  {
    seed: "002 ADR-10 per-user fairness",
    title: "a Free user (1 slot) submits 10 jobs at once while a Pro user (3 slots) submits 3",
    race: [
      "no per-user limit: the Free user's 10 jobs occupy all 5 workers",
      "the Pro user's jobs wait in the queue behind them"
    ],
    run: async (call, user) => {
      const proUser = `${user}-pro`
      const plan = await call("admin", { op: "set_plan", user: proUser, plan: "pro" })
      const [free, pro] = await Promise.all([
        Promise.all(
          Array.from({ length: 10 }, (_, index) =>
            call("ops", { op: "acquire_slot", user, job: `job-${index}` })
          )
        ),
        Promise.all(
          Array.from({ length: 3 }, (_, index) =>
            call("ops", { op: "acquire_slot", user: proUser, job: `pro-job-${index}` })
          )
        )
      ])
      const busy = free.flatMap((result, index) => (result["status"] === "busy" ? [index] : []))
      const running = free.findIndex((result) => result["status"] === "acquired")
      const retryAfter = busy.map((index) => Number(free[index]?.["retryAfterMs"]))
      const lines = [
        `Free user: acquired ${count(free, "acquired")}, busy ${busy.length}, snoozed ${(Math.min(...retryAfter) / 1000).toFixed(1)}-${(Math.max(...retryAfter) / 1000).toFixed(1)} s (30 s + up to 10 s jitter: no thundering herd)`,
        `Pro user at the same moment: acquired ${count(pro, "acquired")} of 3`
      ]
      if (running < 0 || busy[0] === undefined) return { lines, held: false }
      const released = await call("ops", { op: "release_slot", user, job: `job-${running}` })
      const retried = await call("ops", { op: "acquire_slot", user, job: `job-${busy[0]}` })
      lines.push(
        `the Free user's running job ends (release_slot: ${String(released["status"])}); a snoozed job retries: ${String(retried["status"])}`
      )
      return {
        lines,
        held:
          plan["status"] === "ok" &&
          count(free, "acquired") === 1 &&
          busy.length === 9 &&
          retryAfter.every((ms) => ms >= 30_000 && ms <= 40_000) &&
          count(pro, "acquired") === 3 &&
          released["status"] === "released" &&
          retried["status"] === "acquired"
      }
    }
  }
]
