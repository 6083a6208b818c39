/**
 * `list_usage` (revision 1.3): a partition's page of users' `used` in one period. No actor decides it
 * (it names no user): the coordinator checks it against the configuration, then reads the store, which
 * holds every acknowledged change (each is durable before its reply). Only a process that serves the
 * partition answers, as for every other command; another answers `unavailable`.
 */
import { Effect } from "effect"
import type { ListUsageCommand } from "../domain/commands.js"
import type { Config } from "../domain/config.js"
import type { Result } from "../domain/results.js"
import { unavailable } from "../domain/results.js"
import { refuseListUsage } from "../domain/usageHistory.js"
import type { StoreShape } from "../store/Store.js"

export interface ListUsageSettings {
  readonly config: Config
  readonly store: StoreShape
  readonly now: () => number
  readonly servesPartition: (partition: number) => boolean
  readonly onError: (message: string, cause: unknown) => void
  /** Runs the store read in the background (the coordinator's runtime). */
  readonly runFork: (effect: Effect.Effect<void>) => void
}

export const makeListUsage =
  (settings: ListUsageSettings) =>
  (command: ListUsageCommand, reply: (result: Result) => void): void => {
    const refused = refuseListUsage(settings.config, command, settings.now())
    if (refused !== null) return reply(refused)
    if (!settings.servesPartition(command.partition)) return reply(unavailable)
    settings.runFork(
      Effect.match(settings.store.listUsage(command), {
        onFailure: (error) => {
          settings.onError(`list_usage of partition ${command.partition} failed`, error)
          reply(unavailable)
        },
        onSuccess: (page) => reply({ status: "ok", usage: page.usage, more: page.more })
      })
    )
  }
