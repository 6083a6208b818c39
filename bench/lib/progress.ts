/** A progress bar on stderr: redrawn in place on a terminal, one line per run otherwise. */
export interface Progress {
  /** `label` is what runs now; `fraction` how far along it is. */
  readonly update: (label: string, fraction: number) => void
  /** One run finished. */
  readonly advance: (summary: string) => void
  readonly done: () => void
}

const barWidth = 28

export const makeProgress = (totalSteps: number, startedAt: number = Date.now()): Progress => {
  const tty = process.stderr.isTTY === true
  let finished = 0
  let lastLabel = ""
  const draw = (label: string, fraction: number) => {
    const overall = Math.min(1, (finished + fraction) / Math.max(1, totalSteps))
    const filled = Math.round(overall * barWidth)
    const elapsed = ((Date.now() - startedAt) / 1000).toFixed(0)
    const line = `[${"#".repeat(filled)}${".".repeat(barWidth - filled)}] ${finished}/${totalSteps} ${elapsed}s ${label}`
    const columns = process.stderr.columns ?? 120
    process.stderr.write(`\r${line.slice(0, columns - 1).padEnd(columns - 1)}`)
  }
  return {
    update: (label, fraction) => {
      lastLabel = label
      if (tty) draw(label, fraction)
    },
    advance: (summary) => {
      finished += 1
      if (tty) {
        process.stderr.write(`\r${" ".repeat((process.stderr.columns ?? 120) - 1)}\r`)
        process.stderr.write(`  ${summary}\n`)
        draw(lastLabel, 0)
      } else {
        process.stderr.write(`[${finished}/${totalSteps}] ${summary}\n`)
      }
    },
    done: () => {
      if (tty) process.stderr.write("\n")
    }
  }
}
