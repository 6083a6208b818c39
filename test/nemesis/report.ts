/** The nemesis's results: one markdown summary and one JSON file for a series of runs. */
import { mkdir, writeFile } from "node:fs/promises"
import { join } from "node:path"
import { withoutDecisions } from "../cluster/cluster.js"
import type { NemesisResult } from "./nemesis.js"
import type { FaultKind } from "./schedule.js"

export interface SeriesSummary {
  readonly startedAt: string
  readonly baseSeed: number
  readonly kinds: ReadonlyArray<FaultKind>
  readonly runs: ReadonlyArray<Omit<NemesisResult, "logs">>
}

const sum = (values: ReadonlyArray<number>) => values.reduce((total, value) => total + value, 0)

export const faultCounts = (result: Pick<NemesisResult, "applied">): Record<string, number> => {
  const counts: Record<string, number> = {}
  for (const fault of result.applied) counts[fault.kind] = (counts[fault.kind] ?? 0) + 1
  return counts
}

/** The longest unserved stretch after a single fault, and where several overlapped. */
const describeUnserved = (run: Omit<NemesisResult, "logs">): string => {
  const unserved = run.unserved
  if (unserved === undefined) return "unserved: not measured"
  const single = unserved.longestSingle
  const overlapping = unserved.longestOverlapping
  return (
    `unserved (bound ${unserved.boundMs} ms): longest after one fault ` +
    `${single === undefined ? "none over the probe's resolution" : `${single.ms} ms (partition ${single.partition}, ${single.faults[0]?.what ?? "no fault"})`}` +
    `, with several faults ${overlapping === undefined ? "none" : `${overlapping.ms} ms (${overlapping.faults.length} faults)`}`
  )
}

/** One line per run, for the console and the markdown table. */
export const describeRun = (run: Omit<NemesisResult, "logs">): string =>
  `seed ${run.seed}: ${run.applied.length}/${run.planned} faults ${JSON.stringify(faultCounts(run))} in ` +
  `${Math.round(run.faultsMs / 1_000)} s` +
  `${run.world.monthEndMs === undefined ? "" : `, the month ending at +${run.world.monthEndMs} ms`}` +
  `${run.world.ownPostgres ? ", its own Postgres pair" : ""}${run.world.timed ? ", time-driven load" : ""}; ` +
  `calls ${sum(Object.values(run.calls))} ` +
  `(${run.counts.granted} holds granted, ${run.counts.refused} refused, ${run.counts.commits} commits, ` +
  `${run.counts.consumes} consumes, ${run.counts.acquired} slots acquired, ${run.counts.busy} busy, ` +
  `${run.counts.reads} reads); ${run.judged.replies} replies judged, ${run.judged.wrong} wrong; ` +
  `${run.events === undefined ? "events not read" : `${run.events.messages} events ${JSON.stringify(run.events.byKind)} (ids of ${run.events.claimsInStream} claims)`}; ` +
  `${run.staleAnswers} stale answers in the logs; ${describeUnserved(run)}; ` +
  `${run.failedCalls} calls unresolved (${run.uncertainUsers} users uncertain); ` +
  `${run.violations.length} violations` +
  (run.violations[0] === undefined ? "" : ` (first at +${run.violations[0].atMs} ms)`) +
  `; balanced ${run.balancedAfterHealMs === undefined ? "NOT within 30 s" : `${run.balancedAfterHealMs} ms`} after the heal` +
  (run.exits.length === 0 ? "" : `; exits: ${run.exits.join(", ")}`)

export const markdown = (summary: SeriesSummary): string => {
  const runs = summary.runs
  const lines = [
    `# Nemesis results, ${summary.startedAt}`,
    "",
    `Fault kinds: ${summary.kinds.join(", ")}. Seeds ${summary.baseSeed}..${summary.baseSeed + runs.length - 1}, ` +
      `${runs.length} runs, ${Math.round(sum(runs.map((run) => run.faultsMs)) / 60_000)} min of faults in all.`,
    "",
    `Totals: ${sum(runs.map((run) => run.applied.length))} faults applied, ` +
      `${sum(runs.map((run) => sum(Object.values(run.calls))))} calls, ` +
      `${sum(runs.map((run) => run.counts.granted))} holds granted, ` +
      `${sum(runs.map((run) => run.counts.acquired))} slots acquired, ` +
      `${sum(runs.map((run) => run.failedCalls))} calls unresolved, ` +
      `**${sum(runs.map((run) => run.violations.length))} violations**.`,
    "",
    "| seed | faults | calls | replies judged (wrong) | events | longest unserved after one fault | unresolved calls | violations | first at |",
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ...runs.map(
      (run) =>
        `| ${run.seed} | ${Object.entries(faultCounts(run))
          .map(([kind, count]) => `${kind} ${count}`)
          .join(", ")} | ${sum(Object.values(run.calls))} | ${run.judged.replies} (${run.judged.wrong}) | ` +
        `${run.events?.messages ?? "-"} | ${run.unserved?.longestSingle?.ms ?? "-"} ms | ` +
        `${run.failedCalls} | ${run.violations.length} | ${run.violations[0] === undefined ? "-" : `+${run.violations[0].atMs} ms`} |`
    ),
    ""
  ]
  lines.push("Each run:", "", ...runs.map((run) => `- ${describeRun(run)}`), "")
  for (const run of runs.filter((candidate) => candidate.violations.length > 0)) {
    lines.push(`## Seed ${run.seed}: violations`, "", "```")
    lines.push(...run.violations.slice(0, 30).map((violation) => `+${violation.atMs} ms ${violation.what}`))
    lines.push("```", "")
    for (const [user, calls] of Object.entries(run.histories).slice(0, 6))
      lines.push(`Calls of ${user} (ms from the faults' start, world time):`, "", "```", ...calls, "```", "")
    lines.push("Faults applied before the first violation:", "", "```")
    const first = run.violations[0]!.atMs
    lines.push(
      ...run.applied
        .filter((fault) => fault.startedMs <= first)
        .map((fault) => `+${fault.startedMs} ms ${fault.what}`)
    )
    lines.push("```", "")
  }
  return lines.join("\n")
}

/**
 * A process's log as the results keep it: its life (every line but the per-decision ones), and for a
 * failed run the decisions about the users its violations name (the evidence), not every decision.
 */
const keptLog = (text: string, users: ReadonlyArray<string>): string =>
  (users.length === 0
    ? withoutDecisions(text)
    : text
        .split("\n")
        .filter((line) => !line.includes('"op":"') || users.some((user) => line.includes(`"${user}"`)))
        .join("\n")
  )
    .split("\n")
    .map(withoutStack)
    .join("\n")

/** A log line without its error's stack: the message says what failed; the stacks were most of a log. */
const withoutStack = (line: string): string => {
  if (!line.includes('"stack"')) return line
  try {
    const entry = JSON.parse(line) as { err?: { stack?: string } }
    if (entry.err?.stack !== undefined) delete entry.err.stack
    return JSON.stringify(entry)
  } catch {
    return line
  }
}

/**
 * Writes `<name>.md` and `<name>.json` into `directory`, and every run's process logs,
 * `<prefix>-seed<S>-m<member>-<incarnation>.log`: without the decision lines, but for a failed run those
 * about the users its violations name; a failed run's Postgres and nats-server logs too.
 */
export const writeResults = async (
  directory: string,
  /** `nemesis-<time>`: the series' files add `-seed<base>`, its logs `-seed<S>-m<member>-<incarnation>`. */
  prefix: string,
  baseSeed: number,
  summary: SeriesSummary,
  runLogs: ReadonlyArray<{
    readonly seed: number
    readonly failed: boolean
    /** The users the run's violations name. */
    readonly users: ReadonlyArray<string>
    readonly logs: NemesisResult["logs"]
  }>
): Promise<void> => {
  await mkdir(directory, { recursive: true })
  const name = `${prefix}-seed${baseSeed}`
  await writeFile(join(directory, `${name}.md`), markdown(summary))
  await writeFile(join(directory, `${name}.json`), `${JSON.stringify(summary, null, 2)}\n`)
  for (const { seed, failed, users, logs } of runLogs)
    for (const log of logs) {
      // The servers' logs (Postgres's, nats-server's) are evidence only where something went wrong.
      if (!failed && !/^m\d/.test(log.name)) continue
      await writeFile(join(directory, `${prefix}-seed${seed}-${log.name}.log`), keptLog(log.text, users))
    }
}
