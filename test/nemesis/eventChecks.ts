/**
 * The events stream, read whole once every outbox is empty, against Postgres's final state (PROTOCOL.md
 * "Events"; issue 34 item 2):
 *
 * - every `eventId` in the stream once;
 * - a `usage_recorded` for every change of `used` in the ledger, and none for a change the ledger does
 *   not have (lost in a failover, or never made): matched on user, source, ref, key, period and amount;
 * - per user, meter and period, the `usage_recorded` amounts add up to `used` (what a billing consumer
 *   keeping one event per `eventId` would charge, against what was enforced);
 * - a `hold_expired` for every expired hold and only for those, with its figures;
 * - a `limit_changed` for every limit Postgres holds, with its value, once (each user's is set once);
 * - each `usage_threshold` once per user, meter, period and threshold, and one for each threshold the
 *   final `used` reached (none of this load's limits is lowered, so `used` only rises in a period);
 * - no `hold_expired` or `slot_expired` before its instant could have been due on a serving clock;
 * - each event on its user's partition.
 */
import { jetstreamManager } from "@nats-io/jetstream"
import { connect } from "@nats-io/transport-node"
import type pg from "pg"
import { defaultStreamName } from "../../src/config/eventSettings.js"
import { partitionOf } from "../../src/domain/partition.js"
import { sleep } from "../cluster/cluster.js"
import { tablesUpToDate } from "../support/databaseChecks.js"
import { outboxRowCount } from "../support/eventStreams.js"
import type { NemesisLoad } from "./load.js"
import type { NemesisWorld } from "./world.js"

/** How long the outboxes may take to drain once the faults healed and the load stopped. */
const drainMsMax = 60_000
/** The default thresholds (PROTOCOL.md): the nemesis's processes run the built-in configuration. */
const thresholds = [0.8, 1]

interface StreamEvent {
  readonly event: string
  readonly eventId: string
  readonly user: string
  readonly partition: number
  readonly meter?: string
  readonly periodStart?: number | null
  readonly amount?: number
  readonly source?: string
  readonly ref?: string
  readonly key?: string
  readonly id?: string
  readonly consumed?: number
  readonly returned?: number
  readonly limit?: number | null
  readonly threshold?: number
  readonly used?: number
  readonly job?: string
  readonly at?: number
}

export interface EventReport {
  readonly messages: number
  readonly byKind: Record<string, number>
  readonly outboxLeft: number
  /**
   * Claims whose events the stream holds: distinct `<database tag>-<token>` of its event ids
   * (`<database tag>-<token>-<position>-<index>`), each a partition's owner for a while.
   */
  readonly claimsInStream: number
  readonly violations: ReadonlyArray<string>
}

/** Events recorded and not yet published: those of log rows past their partition's published mark. */
const outboxRows = (pool: pg.Pool): Promise<number> => outboxRowCount(pool)

/** Reads of one stream message before it counts as unreadable (a restarted server may answer late). */
const streamReadAttemptsMax = 5

/**
 * Every message of the stream, in order, and the sequences that could not be read: each read is tried
 * again before it is given up, and one given up is reported, never taken for a missing event.
 */
const readStream = async (
  world: NemesisWorld
): Promise<{ readonly events: Array<StreamEvent>; readonly unreadable: Array<string> }> => {
  const nc = await connect({ servers: world.nats.url, name: "nemesis-events" })
  try {
    const manager = await jetstreamManager(nc)
    const stream = defaultStreamName(world.prefix)
    const info = await manager.streams.info(stream)
    const events: Array<StreamEvent> = []
    const unreadable: Array<string> = []
    const read = async (seq: number): Promise<StreamEvent | null> => {
      for (let attempt = 1; ; attempt += 1) {
        try {
          const message = await manager.streams.getMessage(stream, { seq })
          if (message !== null) return message.json<StreamEvent>()
          // Not found: deleted from the stream (its limits), or not yet readable after a restart.
          throw new Error("no message at this sequence")
        } catch (error) {
          if (attempt === streamReadAttemptsMax) {
            unreadable.push(`seq ${seq}: ${String(error)}`)
            return null
          }
          await sleep(200 * attempt)
        }
      }
    }
    for (let seq = info.state.first_seq; seq <= info.state.last_seq; seq += 100) {
      const batch = await Promise.all(
        Array.from({ length: Math.min(100, info.state.last_seq - seq + 1) }, (_, index) => read(seq + index))
      )
      for (const message of batch) if (message !== null) events.push(message)
    }
    return { events, unreadable }
  } finally {
    await nc.close()
  }
}

/** Counts of each string; what is left over after taking `other`'s away, both ways. */
const multisetDifference = (left: ReadonlyArray<string>, right: ReadonlyArray<string>) => {
  const counts = new Map<string, number>()
  for (const item of left) counts.set(item, (counts.get(item) ?? 0) + 1)
  for (const item of right) counts.set(item, (counts.get(item) ?? 0) - 1)
  return {
    onlyLeft: [...counts].flatMap(([item, count]) => (count > 0 ? Array<string>(count).fill(item) : [])),
    onlyRight: [...counts].flatMap(([item, count]) => (count < 0 ? Array<string>(-count).fill(item) : []))
  }
}

const some = (items: ReadonlyArray<string>, max = 8): string =>
  `${items.slice(0, max).join("; ")}${items.length > max ? `; ... (${items.length} in all)` : ""}`

export const checkEvents = async (world: NemesisWorld, load: NemesisLoad): Promise<EventReport> => {
  const pool = world.database.pool
  const deadline = Date.now() + drainMsMax
  while ((await outboxRows(pool)) > 0 && Date.now() < deadline) await sleep(250)
  const outboxLeft = await outboxRows(pool)
  const { events, unreadable } = await readStream(world)
  const violations: Array<string> = []
  // Not a finding about the product: the check could not see these, so what follows may count them
  // as missing.
  if (unreadable.length > 0)
    violations.push(
      `events: stream messages that could not be read (the check is incomplete): ${some(unreadable)}`
    )
  const byKind: Record<string, number> = {}
  for (const event of events) byKind[event.event] = (byKind[event.event] ?? 0) + 1
  if (outboxLeft > 0)
    violations.push(`${outboxLeft} events recorded and not published ${drainMsMax} ms after the heal`)

  const ids = new Map<string, number>()
  for (const event of events) ids.set(event.eventId, (ids.get(event.eventId) ?? 0) + 1)
  const repeated = [...ids].filter(([, count]) => count > 1).map(([id, count]) => `${id} x${count}`)
  if (repeated.length > 0) violations.push(`event ids in the stream more than once: ${some(repeated)}`)
  const misplaced = events.filter((event) => partitionOf(event.user, world.partitions) !== event.partition)
  if (misplaced.length > 0)
    violations.push(`events on another partition than their user's: ${some(misplaced.map((e) => e.eventId))}`)

  // usage_recorded against the ledger's changes of `used` (the logs' rows projected into it first).
  await tablesUpToDate(pool)
  const ledger = await pool.query<{
    user_id: string
    period_start: string
    operation: string
    hold_id: string | null
    key: string
    delta: string
  }>(
    `select user_id, period_start::text, operation, hold_id, key, delta::text
     from quota.usage_ledger where delta <> 0`
  )
  const changeKey = (
    user: string,
    source: string,
    ref: string,
    key: string,
    period: string,
    amount: string
  ) => `${user} ${source} ${ref}${key === "" ? "" : ` key ${key}`} period ${period} amount ${amount}`
  const ledgerKeys = ledger.rows.map((row) =>
    changeKey(
      row.user_id,
      row.operation,
      row.hold_id ?? row.key,
      row.operation === "consume" ? row.key : "",
      row.period_start === "-1" ? "none" : row.period_start,
      row.delta
    )
  )
  const recorded = events.filter((event) => event.event === "usage_recorded")
  const eventKeys = recorded.map((event) =>
    changeKey(
      event.user,
      event.source ?? "?",
      event.ref ?? "?",
      event.source === "consume" ? (event.key ?? "?") : "",
      event.periodStart === null || event.periodStart === undefined ? "none" : String(event.periodStart),
      String(event.amount)
    )
  )
  const { onlyLeft: noEvent, onlyRight: noChange } = multisetDifference(ledgerKeys, eventKeys)
  if (noEvent.length > 0) violations.push(`changes of used with no usage_recorded event: ${some(noEvent)}`)
  if (noChange.length > 0)
    violations.push(`usage_recorded events of changes Postgres does not have: ${some(noChange)}`)

  // The sum rule, per user, meter and period.
  const totals = await pool.query<{ user_id: string; meter: string; period_start: string; used: string }>(
    "select user_id, meter, period_start::text, used::text from quota.usage_totals"
  )
  const sums = new Map<string, number>()
  for (const event of recorded) {
    const key = `${event.user}/${event.meter}/${event.periodStart ?? -1}`
    sums.set(key, (sums.get(key) ?? 0) + (event.amount ?? 0))
  }
  const unequal: Array<string> = []
  const totalKeys = new Set<string>()
  for (const row of totals.rows) {
    const key = `${row.user_id}/${row.meter}/${row.period_start}`
    totalKeys.add(key)
    if ((sums.get(key) ?? 0) !== Number(row.used))
      unequal.push(`${key}: events ${sums.get(key) ?? 0}, used ${row.used}`)
  }
  for (const [key, sum] of sums)
    if (!totalKeys.has(key) && sum !== 0) unequal.push(`${key}: events ${sum}, no usage row`)
  if (unequal.length > 0) violations.push(`usage_recorded amounts unequal to used: ${some(unequal)}`)

  // hold_expired against the expired holds.
  const expired = await pool.query<{ user_id: string; id: string; amount: string; consumed: string }>(
    "select user_id, id, amount::text, consumed::text from quota.holds where state = 'expired'"
  )
  const expiredKeys = expired.rows.map(
    (row) =>
      `${row.user_id}/${row.id} amount ${row.amount} consumed ${row.consumed} returned ${Number(row.amount) - Number(row.consumed)}`
  )
  const expiredEvents = events
    .filter((event) => event.event === "hold_expired")
    .map(
      (event) =>
        `${event.user}/${event.id} amount ${event.amount} consumed ${event.consumed} returned ${event.returned}`
    )
  const holdsDiff = multisetDifference(expiredKeys, expiredEvents)
  if (holdsDiff.onlyLeft.length > 0)
    violations.push(`expired holds with no hold_expired event: ${some(holdsDiff.onlyLeft)}`)
  if (holdsDiff.onlyRight.length > 0)
    violations.push(
      `hold_expired events of holds Postgres does not hold expired so: ${some(holdsDiff.onlyRight)}`
    )

  // limit_changed against the limits stored (each user's set once, to one value).
  const limits = await pool.query<{ user_id: string; meter: string; limit_value: string }>(
    "select user_id, meter, limit_value::text from quota.user_limits"
  )
  const limitsDiff = multisetDifference(
    limits.rows.map((row) => `${row.user_id}/${row.meter} ${row.limit_value}`),
    events
      .filter((event) => event.event === "limit_changed")
      .map((event) => `${event.user}/${event.meter} ${event.limit}`)
  )
  if (limitsDiff.onlyLeft.length > 0)
    violations.push(`limits with no limit_changed event: ${some(limitsDiff.onlyLeft)}`)
  if (limitsDiff.onlyRight.length > 0)
    violations.push(`limit_changed events of limits Postgres does not hold: ${some(limitsDiff.onlyRight)}`)

  // usage_threshold: once each, and one for each threshold the final `used` reached.
  const limitOf = new Map(limits.rows.map((row) => [`${row.user_id}/${row.meter}`, Number(row.limit_value)]))
  const crossings = events
    .filter((event) => event.event === "usage_threshold")
    .map((event) => `${event.user}/${event.meter}/${event.periodStart ?? -1} at ${event.threshold}`)
  const expectedCrossings = totals.rows.flatMap((row) => {
    const limit = limitOf.get(`${row.user_id}/${row.meter}`)
    if (limit === undefined || limit === 0) return []
    return thresholds
      .filter((threshold) => Number(row.used) >= threshold * limit)
      .map((threshold) => `${row.user_id}/${row.meter}/${row.period_start} at ${threshold}`)
  })
  const crossingsDiff = multisetDifference(expectedCrossings, crossings)
  if (crossingsDiff.onlyLeft.length > 0)
    violations.push(`thresholds reached with no usage_threshold event: ${some(crossingsDiff.onlyLeft)}`)
  if (crossingsDiff.onlyRight.length > 0)
    violations.push(
      `usage_threshold events repeated or of a used Postgres does not hold: ${some(crossingsDiff.onlyRight)}`
    )

  // Expiry events not before their instants could have been due: the first instant set was at least
  // the call's sending - B + its duration, and a serving clock expires 2B after it, at most B ahead.
  const clockMs = world.clockOffsetMaxMs
  const starts = new Map(
    load.calls
      .filter((call) => call.op === "reserve" || call.op === "acquire_slot")
      .map((call) => [
        `${call.user}/${call.flow}`,
        call.sentAt + Number(call.input["ttlMs"] ?? call.input["leaseMs"]) + clockMs
      ])
  )
  const early = events.flatMap((event) => {
    if (event.event !== "hold_expired" && event.event !== "slot_expired") return []
    const name = `${event.user}/${event.id ?? event.job}`
    const earliest = starts.get(name)
    if (earliest === undefined) return [`${event.event} of ${name}, never granted`]
    const at = event.at ?? Number.NaN
    return at >= earliest ? [] : [`${event.event} of ${name} at ${at}, due at ${earliest} at the earliest`]
  })
  if (early.length > 0) violations.push(`expiries before they could be due: ${some(early)}`)

  const claimsInStream = new Set(events.map((event) => event.eventId.split("-").slice(0, -2).join("-"))).size
  return {
    claimsInStream,
    messages: events.length,
    byKind,
    outboxLeft,
    violations: violations.map((what) => `events: ${what}`)
  }
}
