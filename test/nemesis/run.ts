/**
 * `npm run nemesis -- --minutes N [--seed S] [--faults doubt,memberLock] [--run-seconds 60]
 * [--intensity 1] [--out DIR] [--keep-going] [--members 3] [--query-timeout-ms 1000] [--lease-ms 6000]
 * [--clock-offset-max-ms 500] [--no-timed] [--month-end yes|no]`
 *
 * Runs seeds S, S+1, ... (each a run of --run-seconds of faults, default 60) until N minutes of faults
 * have run or a run finds a violation (unless --keep-going). The seed comes from --seed, else
 * QUOTA_NEMESIS_SEED, else the clock; it is printed at the start and with every failure, and
 * `--seed S --minutes <one run>` (or QUOTA_NEMESIS_SEED=S) replays that run's plan of faults.
 * Results go to --out when given: markdown, JSON, and every run's process logs (whole for a run with a
 * violation, its decision lines left out otherwise). Exit code 1 when a violation was found.
 * SIGINT or SIGTERM ends every process the runner started (serve, nats-server) before it exits.
 */
import { writeFile } from "node:fs/promises"
import { join } from "node:path"
import { parseArgs } from "node:util"
import buildServe from "../support/buildServe.js"
import { runNemesis } from "./nemesis.js"
import type { NemesisResult } from "./nemesis.js"
import { describeRun, writeResults } from "./report.js"
import type { SeriesSummary } from "./report.js"
import { faultKinds, kindsOnOwnPostgres, parseKinds } from "./schedule.js"
import { standbyAvailable } from "./standby.js"
import { endEverything, faketimeAvailable } from "./world.js"

for (const signal of ["SIGINT", "SIGTERM"] as const)
  process.once(signal, () => {
    console.log(`nemesis: ${signal}, ending the processes it started`)
    void endEverything().finally(() => process.exit(signal === "SIGINT" ? 130 : 143))
  })

const { values } = parseArgs({
  options: {
    minutes: { type: "string", default: "1" },
    seed: { type: "string" },
    faults: { type: "string" },
    "run-seconds": { type: "string", default: "60" },
    intensity: { type: "string", default: "1" },
    out: { type: "string" },
    "keep-going": { type: "boolean", default: false },
    members: { type: "string" },
    "query-timeout-ms": { type: "string" },
    "lease-ms": { type: "string" },
    "clock-offset-max-ms": { type: "string" },
    // The load of long holds and leases only (no expiry, no reads), as the first round's.
    "no-timed": { type: "boolean", default: false },
    // By default a month's end is crossed whenever the run has a Postgres pair of its own.
    "month-end": { type: "string" },
    // Every call of the load written to the results (<prefix>-seed<S>-calls.txt), for a diagnosis.
    calls: { type: "boolean", default: false }
  },
  strict: true
})

const seedText = values.seed ?? process.env["QUOTA_NEMESIS_SEED"]
const baseSeed = seedText === undefined ? Date.now() % 1_000_000 : Number(seedText)
if (!Number.isSafeInteger(baseSeed)) throw new Error(`--seed must be an integer, got ${seedText}`)
const kinds = parseKinds(values.faults).filter((kind) => {
  if (!kindsOnOwnPostgres.has(kind) || standbyAvailable()) return true
  // Asked for by name: a run without it would not be the run asked for.
  if (values.faults !== undefined) throw new Error(`${kind} needs /usr/lib/postgresql/15/bin`)
  console.log(`Postgres 15 binaries not found (/usr/lib/postgresql/15/bin): ${kind} left out`)
  return false
})
if (values["month-end"] !== undefined && !["yes", "no"].includes(values["month-end"]))
  throw new Error(`--month-end is yes or no, got ${values["month-end"]}`)
const clock = faketimeAvailable()
if ((kinds.includes("clock") || kinds.includes("clockBeyond")) && !clock)
  console.log("libfaketime not found (apt-get install -y faketime): clock offsets are not applied")
const runMs = Number(values["run-seconds"]) * 1_000
const budgetMs = Number(values.minutes) * 60_000
const intensity = Number(values.intensity)
/** The world's settings given on the command line (else nemesis.ts's defaults), part of a replay. */
const settings = {
  ...(values.members === undefined ? {} : { members: Number(values.members) }),
  ...(values["query-timeout-ms"] === undefined ? {} : { queryTimeoutMs: Number(values["query-timeout-ms"]) }),
  ...(values["lease-ms"] === undefined ? {} : { leaseMs: Number(values["lease-ms"]) }),
  ...(values["clock-offset-max-ms"] === undefined
    ? {}
    : { clockOffsetMaxMs: Number(values["clock-offset-max-ms"]) }),
  ...(values["no-timed"] ? { timed: false } : {}),
  ...(values["month-end"] === undefined ? {} : { monthEnd: values["month-end"] === "yes" })
}

console.log(
  `nemesis: seed ${baseSeed}, faults ${kinds.join(", ")} (of ${faultKinds.join(", ")}), ` +
    `${values.minutes} min in runs of ${runMs / 1_000} s, intensity ${intensity}` +
    Object.entries(settings)
      .map(([name, value]) => `, ${name} ${value}`)
      .join("")
)
await buildServe()
const startedAt = new Date().toISOString()
const prefix = `nemesis-${startedAt.slice(0, 19).replaceAll(":", "")}`
const runs: Array<Omit<NemesisResult, "logs" | "everyCall">> = []
const replayOptions =
  (values.faults === undefined ? "" : ` --faults ${values.faults}`) +
  (intensity === 1 ? "" : ` --intensity ${intensity}`) +
  (values.members === undefined ? "" : ` --members ${values.members}`) +
  (values["query-timeout-ms"] === undefined ? "" : ` --query-timeout-ms ${values["query-timeout-ms"]}`) +
  (values["lease-ms"] === undefined ? "" : ` --lease-ms ${values["lease-ms"]}`) +
  (values["clock-offset-max-ms"] === undefined
    ? ""
    : ` --clock-offset-max-ms ${values["clock-offset-max-ms"]}`) +
  (values["no-timed"] ? " --no-timed" : "") +
  (values["month-end"] === undefined ? "" : ` --month-end ${values["month-end"]}`)
// A remainder under 10 s is not worth a cluster's start: the series ends there.
for (let seed = baseSeed; runs.length === 0 || budgetMs - sumFaultsMs(runs) >= 10_000; seed += 1) {
  const faultsMs = Math.min(runMs, budgetMs - sumFaultsMs(runs))
  const { logs, everyCall, ...run } = await runNemesis({
    ...settings,
    seed,
    faultsMs,
    kinds,
    clock,
    intensity,
    stopOnViolation: !values["keep-going"],
    keepCalls: values.calls
  })
  runs.push(run)
  console.log(describeRun(run))
  // Written after each run, its logs dropped from memory: an hour of runs' debug logs would not fit,
  // and a series stopped midway keeps what it ran.
  if (values.out !== undefined) {
    const users = Object.keys(run.histories)
    const summary: SeriesSummary = { startedAt, baseSeed, kinds, runs }
    await writeResults(values.out, prefix, baseSeed, summary, [
      { seed, failed: run.violations.length > 0, users, logs }
    ])
    if (everyCall !== undefined)
      await writeFile(
        join(values.out, `${prefix}-seed${seed}-calls.txt`),
        Object.entries(everyCall)
          .map(([user, calls]) => `${user}\n  ${calls.join("\n  ")}`)
          .join("\n")
      )
  }
  if (run.violations.length > 0) {
    console.log(
      `VIOLATIONS with seed ${seed} (replay: npm run nemesis -- --seed ${seed} --minutes ${faultsMs / 60_000}` +
        `${replayOptions}):\n` +
        run.violations
          .slice(0, 20)
          .map((violation) => `+${violation.atMs} ms ${violation.what}`)
          .join("\n")
    )
    if (!values["keep-going"]) break
  }
}
if (values.out !== undefined) console.log(`results in ${values.out}/${prefix}-seed${baseSeed}.md`)
process.exit(runs.some((run) => run.violations.length > 0) ? 1 : 0)

function sumFaultsMs(done: ReadonlyArray<{ faultsMs: number }>): number {
  return done.reduce((total, run) => total + run.faultsMs, 0)
}
