/** Readers of environment variables: each fails with the variable's name and what it must be. */
import { Effect } from "effect"
import type { Environment } from "./SettingsInvalid.js"
import { SettingsInvalid } from "./SettingsInvalid.js"

const durationUnitsMs: Readonly<Record<string, number>> = {
  ms: 1,
  s: 1_000,
  m: 60_000,
  h: 3_600_000,
  d: 86_400_000
}

/** `30s`, `500ms`, `2m`, `1h`, `30d` or a plain number of milliseconds; undefined when it is none of these. */
export const parseDurationMs = (text: string): number | undefined => {
  const match = /^(\d+)(ms|s|m|h|d)?$/.exec(text.trim())
  if (match === null) return undefined
  const ms = Number(match[1]) * (durationUnitsMs[match[2] ?? "ms"] ?? 1)
  return Number.isSafeInteger(ms) ? ms : undefined
}

/** A variable's trimmed value; empty counts as unset. */
export const valueOf = (env: Environment, variable: string): string | undefined => {
  const value = env[variable]
  return value === undefined || value.trim() === "" ? undefined : value.trim()
}

export const invalid = (variable: string, reason: string) =>
  Effect.fail(new SettingsInvalid({ variable, reason }))

export const readInteger = (
  env: Environment,
  variable: string,
  min: number,
  max: number,
  fallback?: number
) => {
  const text = valueOf(env, variable)
  if (text === undefined) return Effect.succeed(fallback)
  const value = /^\d+$/.test(text) ? Number(text) : NaN
  return Number.isSafeInteger(value) && value >= min && value <= max
    ? Effect.succeed(value)
    : invalid(variable, `must be an integer from ${min} to ${max}, got ${JSON.stringify(text)}`)
}

const formatMs = (ms: number): string =>
  ms % 86_400_000 === 0
    ? `${ms / 86_400_000}d`
    : ms % 3_600_000 === 0
      ? `${ms / 3_600_000}h`
      : ms % 60_000 === 0
        ? `${ms / 60_000}m`
        : ms % 1_000 === 0
          ? `${ms / 1_000}s`
          : `${ms}ms`

export const readDuration = (
  env: Environment,
  variable: string,
  fallback: number,
  min: number,
  max: number
) => {
  const text = valueOf(env, variable)
  if (text === undefined) return Effect.succeed(fallback)
  const ms = parseDurationMs(text)
  return ms !== undefined && ms >= min && ms <= max
    ? Effect.succeed(ms)
    : invalid(
        variable,
        `must be a duration like 30s, 500ms, 2m, 1h, 30d or a number of milliseconds, from ${formatMs(min)} to ${formatMs(max)}; got ${JSON.stringify(text)}`
      )
}

export const readBoolean = (env: Environment, variable: string, fallback: boolean) => {
  const text = valueOf(env, variable)?.toLowerCase()
  if (text === undefined) return Effect.succeed(fallback)
  if (["true", "1", "yes", "on"].includes(text)) return Effect.succeed(true)
  if (["false", "0", "no", "off"].includes(text)) return Effect.succeed(false)
  return invalid(variable, `must be true or false, got ${JSON.stringify(text)}`)
}
