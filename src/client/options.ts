/**
 * The client's settings: defaults from src/domain/limits.ts, checked once at construction. A bad
 * setting is a programmer error and throws at once rather than misrouting commands later.
 */
import {
  batchCommandsMax,
  clientRequestTimeoutMs,
  clientRetryAttemptsMax,
  clientRetryBaseDelayMs,
  clientRetryDelayMsMax,
  messageBytesMax,
  partitionsMax
} from "../domain/limits.js"

export interface RetryPolicy {
  /** Attempts per command, the first included. */
  readonly attemptsMax: number
  /** Backoff before the first retry; it doubles per attempt. */
  readonly baseDelayMs: number
  /** The longest backoff. */
  readonly delayMsMax: number
}

export interface QuotaClientOptions {
  /** Subject prefix of the deployment; default `quota`. */
  readonly prefix?: string
  /** Number of partitions of the deployment; default 64. Must match the coordinator's. */
  readonly partitions?: number
  /** How long one request message waits for its reply before it is retried. */
  readonly timeoutMs?: number
  readonly retry?: Partial<RetryPolicy>
  /** Commands coalesced into one message, at most 1000 (the protocol's batch limit). */
  readonly batchCommandsMax?: number
  /** Random source in [0, 1) for retry jitter; tests inject a fixed one. */
  readonly random?: () => number
}

export interface ResolvedOptions {
  readonly prefix: string
  readonly partitions: number
  readonly timeoutMs: number
  readonly retry: RetryPolicy
  readonly batchCommandsMax: number
  readonly messageBytesMax: number
  readonly random: () => number
}

export const defaultPrefix = "quota"
export const defaultPartitions = 64

// The one place library code reaches for Math.random: callers and tests inject `random` instead.
// eslint-disable-next-line no-restricted-syntax
const defaultRandom: () => number = Math.random

const requireInteger = (name: string, value: number, min: number, max: number): number => {
  if (!Number.isInteger(value) || value < min || value > max) {
    throw new RangeError(`QuotaClient option ${name} must be an integer from ${min} to ${max}, got ${value}`)
  }
  return value
}

/** A NATS subject prefix: one or more tokens, no wildcards or whitespace. */
const prefixPattern = /^[^\s.*>]+(\.[^\s.*>]+)*$/

export const resolveOptions = (options: QuotaClientOptions): ResolvedOptions => {
  const prefix = options.prefix ?? defaultPrefix
  if (!prefixPattern.test(prefix)) {
    throw new RangeError(
      `QuotaClient option prefix must be a NATS subject without wildcards, got "${prefix}"`
    )
  }
  const baseDelayMs = requireInteger(
    "retry.baseDelayMs",
    options.retry?.baseDelayMs ?? clientRetryBaseDelayMs,
    0,
    3_600_000
  )
  return {
    prefix,
    partitions: requireInteger("partitions", options.partitions ?? defaultPartitions, 1, partitionsMax),
    timeoutMs: requireInteger("timeoutMs", options.timeoutMs ?? clientRequestTimeoutMs, 1, 3_600_000),
    retry: {
      attemptsMax: requireInteger(
        "retry.attemptsMax",
        options.retry?.attemptsMax ?? clientRetryAttemptsMax,
        1,
        1_000
      ),
      baseDelayMs,
      delayMsMax: requireInteger(
        "retry.delayMsMax",
        options.retry?.delayMsMax ?? Math.max(clientRetryDelayMsMax, baseDelayMs),
        baseDelayMs,
        3_600_000
      )
    },
    batchCommandsMax: requireInteger(
      "batchCommandsMax",
      options.batchCommandsMax ?? batchCommandsMax,
      1,
      batchCommandsMax
    ),
    messageBytesMax,
    random: options.random ?? defaultRandom
  }
}

/**
 * Backoff before the next attempt, after `attempts` attempts failed. Equal jitter: half of the
 * capped exponential delay is fixed, so the wait still grows, and half is random, so clients that
 * failed together (a coordinator restarting) do not all come back in the same millisecond.
 */
export const retryDelayMs = (attempts: number, policy: RetryPolicy, random: () => number): number => {
  const ceilingMs = Math.min(policy.delayMsMax, policy.baseDelayMs * 2 ** Math.max(0, attempts - 1))
  return ceilingMs / 2 + (random() * ceilingMs) / 2
}
