/** The environment settings are read from, and the error of a setting that cannot be used. */
import { Data } from "effect"

export type Environment = Readonly<Record<string, string | undefined>>

/** A setting that cannot be used; `variable` names the environment variable. */
export class SettingsInvalid extends Data.TaggedError("SettingsInvalid")<{
  readonly variable: string
  readonly reason: string
}> {
  override get message(): string {
    return `${this.variable}: ${this.reason}`
  }
}
