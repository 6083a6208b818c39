/**
 * Where the client's prefix and partition count come from: the options first, then QUOTA_PREFIX and
 * QUOTA_PARTITIONS of `options.env` (read as the coordinator reads them), then, with `discover`, the
 * running coordinator's `$SRV.INFO` metadata (`prefix`, `partitions`), else the defaults. A value the
 * client has that differs from the coordinator's is an error: a wrong partition count would send every
 * user's commands to another partition's subject.
 */
import type { Msg, NatsConnection } from "@nats-io/transport-node"
import { Cause, Effect } from "effect"
import type { Environment } from "../config/SettingsInvalid.js"
import { readPartitions, readPrefix } from "../config/subjectSettings.js"
import { clientDiscoveryStallMs, clientDiscoveryWaitMs } from "../domain/limits.js"
import { CoordinatorDisagrees, DiscoveryFailed } from "./errors.js"

export interface SubjectSettingsOptions {
  readonly prefix?: string
  readonly partitions?: number
  readonly env?: Environment
  /** Learn prefix and partitions from the running coordinator (`$SRV.INFO.quota-coordinator`). */
  readonly discover?: boolean
}

/** One coordinator instance as its `$SRV.INFO` reply describes it. */
export interface CoordinatorInfo {
  readonly id: string
  readonly prefix: string | undefined
  readonly partitions: number | undefined
}

interface Known<T> {
  readonly value: T
  readonly source: string
}

const infoSubject = "$SRV.INFO.quota-coordinator"

const infoOf = (msg: Msg): CoordinatorInfo | undefined => {
  try {
    const info = msg.json<{ id?: unknown; metadata?: Record<string, unknown> | null }>()
    const partitions = Number(info.metadata?.["partitions"])
    const prefix = info.metadata?.["prefix"]
    return {
      id: String(info.id),
      prefix: typeof prefix === "string" ? prefix : undefined,
      partitions: Number.isInteger(partitions) && partitions > 0 ? partitions : undefined
    }
  } catch {
    return undefined
  }
}

/** Every coordinator instance that answers `$SRV.INFO.quota-coordinator` within the wait. */
export const discoverCoordinators = async (nc: NatsConnection): Promise<ReadonlyArray<CoordinatorInfo>> => {
  const found: Array<CoordinatorInfo> = []
  try {
    const replies = await nc.requestMany(infoSubject, "", {
      strategy: "stall",
      stall: clientDiscoveryStallMs,
      maxWait: clientDiscoveryWaitMs
    })
    for await (const msg of replies) {
      const info = infoOf(msg)
      if (info !== undefined) found.push(info)
    }
  } catch {
    // No responders, or the wait ended: what was found is the answer.
  }
  return found
}

const knownOf = async (options: SubjectSettingsOptions) => {
  const env = options.env ?? {}
  const fromEnv = await Effect.runPromise(
    Effect.all({ prefix: readPrefix(env), partitions: readPartitions(env) })
  ).catch((error: unknown) => {
    throw Cause.isCause(error) ? Cause.squash(error) : error
  })
  const known = <T>(option: T | undefined, name: string, variable: string, envValue: T | undefined) =>
    option !== undefined
      ? { value: option, source: `option ${name}` }
      : envValue !== undefined
        ? { value: envValue, source: variable }
        : undefined
  return {
    prefix: known(options.prefix, "prefix", "QUOTA_PREFIX", fromEnv.prefix),
    partitions: known(options.partitions, "partitions", "QUOTA_PARTITIONS", fromEnv.partitions)
  }
}

const learnFrom = (
  instances: ReadonlyArray<CoordinatorInfo>,
  prefix: Known<string> | undefined,
  partitions: Known<number> | undefined
): { readonly prefix: string; readonly partitions: number } => {
  const prefixes = [...new Set(instances.map((instance) => instance.prefix))]
  const matching = instances.filter((instance) => prefix === undefined || instance.prefix === prefix.value)
  if (matching.length === 0) {
    const reason =
      instances.length === 0
        ? `no coordinator answered ${infoSubject} within ${clientDiscoveryWaitMs} ms`
        : `coordinators answered with prefixes ${JSON.stringify(prefixes)}, none ${JSON.stringify(prefix?.value)} (from ${prefix?.source})`
    throw new DiscoveryFailed({ prefix: prefix?.value, reason })
  }
  if (prefix === undefined && prefixes.length > 1) {
    const reason = `coordinators of several prefixes answered (${JSON.stringify(prefixes)}): set prefix or QUOTA_PREFIX`
    throw new DiscoveryFailed({ prefix: undefined, reason })
  }
  const first = matching[0]!
  if (first.prefix === undefined || first.partitions === undefined) {
    const reason = `coordinator ${first.id} announces no prefix or partitions in its metadata`
    throw new DiscoveryFailed({ prefix: prefix?.value, reason })
  }
  for (const instance of matching) {
    const known = partitions ?? { value: first.partitions, source: `coordinator ${first.id}` }
    if (instance.partitions !== known.value) {
      throw new CoordinatorDisagrees({
        setting: "partitions",
        client: known.value,
        source: known.source,
        coordinator: instance.partitions ?? "none",
        serviceId: instance.id
      })
    }
  }
  return { prefix: first.prefix, partitions: first.partitions }
}

/**
 * The prefix and partitions to use (undefined: the client's defaults). Rejects with `SettingsInvalid`
 * for a bad QUOTA_PREFIX or QUOTA_PARTITIONS, and with `discover` with `DiscoveryFailed` or
 * `CoordinatorDisagrees`.
 */
export const resolveSubjectSettings = async (
  nc: NatsConnection,
  options: SubjectSettingsOptions
): Promise<{ readonly prefix?: string | undefined; readonly partitions?: number | undefined }> => {
  const known = await knownOf(options)
  if (options.discover !== true) return { prefix: known.prefix?.value, partitions: known.partitions?.value }
  return learnFrom(await discoverCoordinators(nc), known.prefix, known.partitions)
}
