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

/** One line per run, for the console and the markdown table. */
export const describeRun = (run: Omit<NemesisResult, "logs">): string =>
  `seed ${run.seed}: ${run.applied.length}/${run.planned} faults ${JSON.stringify(faultCounts(run))} in ` +
  `${Math.round(run.faultsMs / 1_000)} s; calls ${sum(Object.values(run.calls))} ` +
  `(${run.counts.granted} holds granted, ${run.counts.refused} refused, ${run.counts.commits} commits, ` +
  `${run.counts.consumes} consumes, ${run.counts.acquired} slots acquired, ${run.counts.busy} busy); ` +
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
    "| seed | faults | calls | holds granted | slots acquired | unresolved calls | violations | first at |",
    "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ...runs.map(
      (run) =>
        `| ${run.seed} | ${Object.entries(faultCounts(run))
          .map(([kind, count]) => `${kind} ${count}`)
          .join(
            ", "
          )} | ${sum(Object.values(run.calls))} | ${run.counts.granted} | ${run.counts.acquired} | ` +
        `${run.failedCalls} | ${run.violations.length} | ${run.violations[0] === undefined ? "-" : `+${run.violations[0].atMs} ms`} |`
    ),
    ""
  ]
  for (const run of runs.filter((candidate) => candidate.violations.length > 0)) {
    lines.push(`## Seed ${run.seed}: violations`, "", "```")
    lines.push(...run.violations.slice(0, 30).map((violation) => `+${violation.atMs} ms ${violation.what}`))
    lines.push("```", "", "Faults applied before the first violation:", "", "```")
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
 * Writes `<name>.md` and `<name>.json` into `directory`, and every run's process logs,
 * `<prefix>-seed<S>-m<member>-<incarnation>.log`: whole for a failed run, else without the decision lines.
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
    readonly logs: NemesisResult["logs"]
  }>
): Promise<void> => {
  await mkdir(directory, { recursive: true })
  const name = `${prefix}-seed${baseSeed}`
  await writeFile(join(directory, `${name}.md`), markdown(summary))
  await writeFile(join(directory, `${name}.json`), `${JSON.stringify(summary, null, 2)}\n`)
  for (const { seed, failed, logs } of runLogs)
    for (const log of logs)
      await writeFile(
        join(directory, `${prefix}-seed${seed}-${log.name}.log`),
        failed ? log.text : withoutDecisions(log.text)
      )
}
