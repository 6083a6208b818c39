/**
 * The nemesis's short run (test/nemesis): two fixed seeds, 25 s of overlapping faults each against
 * three `serve` processes under the time-driven flow load, on a Postgres primary and synchronous standby
 * of its own, with every clock (Postgres's included) set so that a month ends during the faults, where
 * libfaketime is installed. No reply may break the per-user model (reads and refusals included),
 * nothing in Postgres may break the invariant or contradict the clients, the events stream must match
 * Postgres, no process may answer from stale memory or exit on its own, every call must resolve and
 * every partition be served within its bound. `npm run nemesis` runs the same for longer, on other seeds.
 */
import { describe, expect, it } from "vitest"
import { withoutDecisions } from "./cluster.js"
import { runNemesis } from "../nemesis/nemesis.js"
import { describeRun } from "../nemesis/report.js"
import type { FaultKind } from "../nemesis/schedule.js"
import { faultKinds } from "../nemesis/schedule.js"
import { standbyAvailable } from "../nemesis/standby.js"
import { faketimeAvailable } from "../nemesis/world.js"

const seeds = [1, 2]
const faultsMs = 25_000

/**
 * Left out: standbyStall and storeSilent (8-20 s each, run by `npm run nemesis`). Promote is in since
 * issue 34 items 1 and 2 were fixed (before, seeds 11, 419 and 432 lost acknowledged changes and
 * events after a failover that followed a doubt settled while the standby stalled).
 */
const leftOut: ReadonlySet<FaultKind> = new Set(["standbyStall", "storeSilent"])
const kinds = faultKinds.filter(
  (kind) => !leftOut.has(kind) && (kind !== "postgresRestart" || standbyAvailable())
)

describe("nemesis: overlapping faults from a seed", () => {
  it.each(seeds)("seed %i: no violation", async (seed) => {
    const { logs, ...run } = await runNemesis({
      seed,
      faultsMs,
      kinds,
      clock: faketimeAvailable(),
      log: () => {}
    })
    const summary = describeRun(run)
    console.log(summary)
    const violations = run.violations.map((violation) => `+${violation.atMs} ms ${violation.what}`)
    const evidence = run.applied.map((fault) => `+${fault.startedMs} ms ${fault.what}`).join("\n")
    // A crash or a call that never resolved is a violation too: the processes' lives are the evidence.
    const lives = logs.map((log) => `--- ${log.name}\n${withoutDecisions(log.text)}`).join("\n")
    expect(violations, `seed ${seed}: ${summary}\nfaults:\n${evidence}\n${lives}`).toEqual([])
    // The faults really ran and the load really ran through them, and the checks had something to judge.
    expect(run.applied.length, summary).toBeGreaterThan(3)
    expect(run.counts.granted, summary).toBeGreaterThan(100)
    expect(run.judged.replies, summary).toBeGreaterThan(1_000)
    expect(run.events?.messages, summary).toBeGreaterThan(100)
  })
})
