/**
 * How many runs each property makes, in one place. Default 200 per property; long runs multiply it:
 *
 *   QUOTA_PROPERTY_RUNS_FACTOR=100 npx vitest run test/property
 *
 * A failure prints fast-check's `{ seed, path }`; replay exactly that case with
 *
 *   QUOTA_PROPERTY_SEED=<seed> QUOTA_PROPERTY_PATH=<path> npx vitest run test/property -t '<name>'
 *
 * A property over fc.commands also needs the commands' own shrink path (the counterexample's
 * `replayPath`), given as QUOTA_PROPERTY_REPLAY_PATH; the replay line printed on failure includes it.
 */
import fc from "fast-check"

export const defaultRuns = 200

const positiveNumber = (name: string): number | undefined => {
  const raw = process.env[name]
  if (raw === undefined || raw === "") return undefined
  const value = Number(raw)
  if (!Number.isFinite(value) || value <= 0) throw new Error(`${name} must be a positive number, got ${raw}`)
  return value
}

/** QUOTA_PROPERTY_RUNS_FACTOR, default 1. */
export const runsFactor = (): number => positiveNumber("QUOTA_PROPERTY_RUNS_FACTOR") ?? 1

/** fast-check parameters: runs x factor, and a replayed seed and path when the environment gives them. */
export const propertyParameters = <T>(runs = defaultRuns): fc.Parameters<T> => {
  const rawSeed = process.env.QUOTA_PROPERTY_SEED
  const seed = rawSeed === undefined || rawSeed === "" ? undefined : Number(rawSeed)
  if (seed !== undefined && !Number.isInteger(seed))
    throw new Error(`QUOTA_PROPERTY_SEED must be an integer, got ${rawSeed}`)
  const path = process.env.QUOTA_PROPERTY_PATH
  const replay: fc.Parameters<T> = seed === undefined ? {} : { seed, ...(path === undefined ? {} : { path }) }
  return { numRuns: Math.max(1, Math.round(runs * runsFactor())), ...replay }
}

/**
 * fc.commands settings: `settings`, and the replayed commands' shrink path when QUOTA_PROPERTY_REPLAY_PATH
 * gives it (without it, fast-check cannot replay a shrunk command list: "Unable to replay").
 */
export const commandsSettings = (settings: {
  readonly maxCommands: number
  readonly size?: fc.SizeForArbitrary
}): fc.CommandsContraints => {
  const replayPath = process.env.QUOTA_PROPERTY_REPLAY_PATH
  return { ...settings, ...(replayPath === undefined || replayPath === "" ? {} : { replayPath }) }
}

/** A vitest timeout for a property: `baseMs` at the default runs, scaled with the factor. */
export const propertyTimeoutMs = (baseMs = 60_000): number => Math.round(baseMs * Math.max(1, runsFactor()))

/**
 * Runs an async property and rethrows fast-check's report (seed, path, counterexample, and for a
 * scheduler its task log) with the property's name in front, so a CI log says what to replay.
 */
export const assertProperty = async <T>(
  name: string,
  property: fc.IAsyncProperty<T>,
  parameters: fc.Parameters<T> = propertyParameters<T>()
): Promise<fc.RunDetails<T>> => {
  const details = await fc.check(property, parameters)
  if (details.failed) {
    const error = details.errorInstance
    const why = error instanceof Error ? (error.stack ?? error.message) : String(error)
    const report = fc.defaultReportMessage(details) ?? "failed"
    const replayPath = /\/\*replayPath="([^"]*)"\*\//.exec(report)?.[1]
    throw new Error(
      `${name}\n${report}\n` +
        `replay: QUOTA_PROPERTY_SEED=${details.seed} QUOTA_PROPERTY_PATH=${details.counterexamplePath ?? ""}` +
        `${replayPath === undefined ? "" : ` QUOTA_PROPERTY_REPLAY_PATH='${replayPath}'`}\n` +
        `failure: ${why}`
    )
  }
  return details
}
