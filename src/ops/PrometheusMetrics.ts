/**
 * The metrics `GET /metrics` serves, in a prom-client registry: PROTOCOL.md's `quota_*` metrics and
 * the Node process's own (CPU, memory, event-loop lag, GC).
 *
 * Counting costs little on the hot path: a command's count and duration go into typed arrays indexed
 * by op and status (a few array writes), and prom-client is brought up to date when it is scraped
 * (`collect`). prom-client's own `inc`/`observe` hash their labels on every call (measured here:
 * about 0.55 µs per command for a counter and a histogram), which at tens of thousands of commands a
 * second would be a visible share of the coordinator's CPU.
 */
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from "prom-client"
import type { MetricType } from "prom-client"
import type { Operation } from "../domain/commands.js"
import type { Status } from "../domain/results.js"
import { quotaEventKinds } from "../domain/events.js"
import type { MetricsRecorder } from "./MetricsRecorder.js"
import { eventLoopSampleIntervalMs } from "../domain/limits.js"

/** Every op a command can have on the wire, and `unknown` for one whose op could not be read. */
export const operationLabels = [
  "reserve",
  "consume",
  "commit",
  "release",
  "extend",
  "adjust",
  "acquire_slot",
  "renew_slot",
  "release_slot",
  "get_usage",
  "set_plan",
  "set_limit",
  "list_holds",
  "unknown"
] as const satisfies ReadonlyArray<Exclude<Operation, "tick"> | "unknown">

/** Every status of PROTOCOL.md's results (src/domain/results.ts). */
export const statusLabels = [
  "reserved",
  "consumed",
  "committed",
  "released",
  "extended",
  "adjusted",
  "exists",
  "conflict",
  "closed",
  "insufficient_quota",
  "acquired",
  "renewed",
  "busy",
  "not_found",
  "ok",
  "unknown_meter",
  "unknown_plan",
  "invalid_request",
  "wrong_partition",
  "unavailable",
  "overloaded",
  "limit_reached"
] as const satisfies ReadonlyArray<Status>

// Fails to compile when a status is added to the protocol's union and not here.
type MissingStatus = Exclude<Status, (typeof statusLabels)[number]>
const everyStatusListed: MissingStatus extends never ? true : MissingStatus = true
void everyStatusListed

/** Seconds from a message's receipt to its reply: an `acquire_slot` may wait up to 5 minutes. */
export const commandDurationBuckets = [
  0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 120, 300
]

/** Seconds of one group commit (BEGIN to COMMIT's answer). */
export const storeCommitDurationBuckets = [
  0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10
]

/** The label value for anything not in the configured list: keeps the series count bounded. */
export const otherLabel = "other"

/** Read when scraped: what the coordinator holds right now. */
export interface GaugeSources {
  readonly slotWaiters: () => number
  readonly actorsResident: () => number
  readonly partitionsOwned: () => number
  /** Partitions no process has held for longer than a lease, as this process's last rounds saw them. */
  readonly partitionsUnowned: () => number
  readonly eventsPending: () => number
  /** This process's clock minus Postgres's, as last measured (0 until measured, or unchecked). */
  readonly clockOffsetMs: () => number
  /** Whether that offset (with its uncertainty) is beyond QUOTA_CLOCK_OFFSET_MAX_MS. */
  readonly clockBeyondMax: () => boolean
  /** The primary's synchronous standbys as last read (src/cli/watchReplication.ts); 0 until read. */
  readonly postgresSynchronousStandbys: () => number
}

export interface PrometheusMetricsOptions {
  /** The configuration's meters and plans: the only label values `meter` and `plan` take. */
  readonly meters: ReadonlyArray<string>
  readonly plans: ReadonlyArray<string>
  /** The Node process's own metrics (default true); tests of the quota_* set leave them out. */
  readonly processMetrics?: boolean
}

export interface PrometheusMetrics {
  readonly registry: Registry
  readonly recorder: MetricsRecorder
  /** Connects the gauges to what they read; until then they read 0. */
  readonly setGaugeSources: (sources: Partial<GaugeSources>) => void
  /** The exposition text, and its content type. */
  readonly scrape: () => Promise<{ readonly contentType: string; readonly body: string }>
}

/** Index of a label value in its list; `fallback` for any other value. */
const indexer = (values: ReadonlyArray<string>, fallback: number): ((value: string) => number) => {
  const indexes = new Map(values.map((value, index) => [value, index]))
  return (value) => indexes.get(value) ?? fallback
}

/**
 * Counts per cell of a labelled counter, kept in a typed array and handed to prom-client's counter as
 * increments when it is scraped.
 */
const countedCounter = (
  counter: Counter<string>,
  cellLabels: ReadonlyArray<Record<string, string>>,
  /** Show every cell at 0 from the start (a short, configured list: meters, plans). */
  zeroed = false
): Float64Array => {
  if (zeroed) for (const labels of cellLabels) counter.inc(labels, 0)
  const counts = new Float64Array(cellLabels.length)
  const reported = new Float64Array(cellLabels.length)
  ;(counter as unknown as { collect: () => void }).collect = () => {
    for (let cell = 0; cell < counts.length; cell += 1) {
      const delta = counts[cell]! - reported[cell]!
      if (delta === 0) continue
      counter.inc(cellLabels[cell]!, delta)
      reported[cell] = counts[cell]!
    }
  }
  return counts
}

/**
 * A histogram whose observations are counted into typed arrays per label value, and read out in
 * prom-client's own shape when scraped (prom-client writes the exposition text). One observation is a
 * bucket search over a dozen bounds and three array writes.
 */
class CountedHistogram extends Histogram<string> {
  readonly bucketCounts: ReadonlyArray<Float64Array>
  readonly sums: Float64Array
  readonly counts: Float64Array

  constructor(
    private readonly metricName: string,
    private readonly metricHelp: string,
    private readonly bounds: ReadonlyArray<number>,
    private readonly labelName: string | undefined,
    private readonly labelValues: ReadonlyArray<string>,
    registry: Registry
  ) {
    super({
      name: metricName,
      help: metricHelp,
      buckets: [...bounds],
      labelNames: labelName === undefined ? [] : [labelName],
      registers: [registry]
    })
    const cells = labelName === undefined ? 1 : labelValues.length
    this.bucketCounts = Array.from({ length: cells }, () => new Float64Array(bounds.length))
    this.sums = new Float64Array(cells)
    this.counts = new Float64Array(cells)
  }

  /** Counts `seconds` in the cell of the label value at `cell` (0 for an unlabelled histogram). */
  record(cell: number, seconds: number): void {
    const buckets = this.bucketCounts[cell]!
    const bounds = this.bounds
    for (let index = 0; index < bounds.length; index += 1) {
      if (seconds <= bounds[index]!) {
        buckets[index]! += 1
        break
      }
    }
    this.sums[cell]! += seconds
    this.counts[cell]! += 1
  }

  private values() {
    const name = this.metricName
    const values: Array<{ labels: Record<string, string | number>; value: number; metricName: string }> = []
    for (let cell = 0; cell < this.counts.length; cell += 1) {
      const count = this.counts[cell]!
      // Only label values seen, as prom-client's own histograms do.
      if (count === 0) continue
      const labels: Record<string, string> =
        this.labelName === undefined ? {} : { [this.labelName]: this.labelValues[cell]! }
      let cumulative = 0
      this.bounds.forEach((bound, index) => {
        cumulative += this.bucketCounts[cell]![index]!
        values.push({ labels: { ...labels, le: bound }, value: cumulative, metricName: `${name}_bucket` })
      })
      values.push({ labels: { ...labels, le: "+Inf" }, value: count, metricName: `${name}_bucket` })
      values.push({ labels, value: this.sums[cell]!, metricName: `${name}_sum` })
      values.push({ labels, value: count, metricName: `${name}_count` })
    }
    return values
  }

  override async get() {
    return {
      name: this.metricName,
      help: this.metricHelp,
      // prom-client's typings declare a numeric enum; at run time the type is this string.
      type: "histogram" as unknown as MetricType,
      values: this.values(),
      aggregator: "sum" as const,
      collect: () => {}
    }
  }

  /** What the registry reads for the text format (prom-client's own histograms have it too). */
  async getForPromString() {
    return this.get()
  }
}

export const makePrometheusMetrics = (options: PrometheusMetricsOptions): PrometheusMetrics => {
  const registry = new Registry()
  // The event-loop delay is sampled by a timer: prom-client's default, every 10 ms, was a third of an
  // idle coordinator's CPU (bench/idle.ts). A stall still delays the next sample by its length, so
  // lags of interest (the dashboard's alert is at 100 ms) are seen at this precision too.
  if (options.processMetrics ?? true)
    collectDefaultMetrics({ register: registry, eventLoopMonitoringPrecision: eventLoopSampleIntervalMs })

  const operationIndex = indexer(operationLabels, operationLabels.indexOf("unknown"))
  const statusIndex = indexer(statusLabels, -1)
  const meterLabels = [...options.meters, otherLabel]
  const planLabels = [...options.plans, otherLabel]
  const meterIndex = indexer(options.meters, options.meters.length)
  const planIndex = indexer(options.plans, options.plans.length)

  const commandCells = operationLabels.flatMap((op) => statusLabels.map((status) => ({ op, status })))
  const commands = countedCounter(
    new Counter({
      name: "quota_commands_total",
      help: "Commands answered, by op and result status (every decided command, refusals included).",
      labelNames: ["op", "status"],
      registers: [registry]
    }),
    commandCells
  )
  const commandDuration = new CountedHistogram(
    "quota_command_duration_seconds",
    "Seconds from a request message's receipt to its reply, per command, by op.",
    commandDurationBuckets,
    "op",
    operationLabels,
    registry
  )
  const storeCommitDuration = new CountedHistogram(
    "quota_store_commit_duration_seconds",
    "Seconds of one group commit to Postgres (many actors' writes in one transaction).",
    storeCommitDurationBuckets,
    undefined,
    [],
    registry
  )
  const storeCommitsFailed = countedCounter(
    new Counter({
      name: "quota_store_commits_failed_total",
      help: "Group commits that failed (Postgres away, a fenced epoch): their commands were answered unavailable.",
      registers: [registry]
    }),
    [{}],
    true
  )
  const holdsExpired = countedCounter(
    new Counter({
      name: "quota_holds_expired_total",
      help: "Pending holds that reached expiresAt without commit or release (orphans), by meter.",
      labelNames: ["meter"],
      registers: [registry]
    }),
    meterLabels.map((meter) => ({ meter })),
    true
  )
  const slotsBusy = countedCounter(
    new Counter({
      name: "quota_slots_busy_total",
      help: "acquire_slot answered busy (the caller snoozes retryAfterMs), by the user's plan.",
      labelNames: ["plan"],
      registers: [registry]
    }),
    planLabels.map((plan) => ({ plan })),
    true
  )
  const eventsPublished = countedCounter(
    new Counter({
      name: "quota_events_published_total",
      help: "Events the JetStream stream acknowledged and stored, by kind.",
      labelNames: ["kind"],
      registers: [registry]
    }),
    quotaEventKinds.map((kind) => ({ kind })),
    true
  )
  const eventKindIndex = indexer(quotaEventKinds, -1)
  const eventsRepublished = countedCounter(
    new Counter({
      name: "quota_events_republished_total",
      help: "Events published again that the stream already had (after a crash or a hand-off): kept once.",
      registers: [registry]
    }),
    [{}],
    true
  )
  const fencedWrites = countedCounter(
    new Counter({
      name: "quota_fenced_writes_total",
      help: "Writes refused because this process no longer owned a partition they touched (epoch fence).",
      registers: [registry]
    }),
    [{}],
    true
  )

  let sources: GaugeSources = {
    slotWaiters: () => 0,
    actorsResident: () => 0,
    partitionsOwned: () => 0,
    partitionsUnowned: () => 0,
    eventsPending: () => 0,
    clockOffsetMs: () => 0,
    clockBeyondMax: () => false,
    postgresSynchronousStandbys: () => 0
  }
  const gauge = (name: string, help: string, read: (current: GaugeSources) => number) =>
    new Gauge({
      name,
      help,
      registers: [registry],
      collect() {
        this.set(read(sources))
      }
    })
  gauge("quota_slot_waiters", "acquire_slot callers waiting in users' FIFO queues.", (s) => s.slotWaiters())
  gauge("quota_actors_resident", "User actors resident in memory.", (s) => s.actorsResident())
  gauge("quota_partitions_owned", "Partitions this process serves.", (s) => s.partitionsOwned())
  gauge(
    "quota_partitions_unowned",
    "Partitions no process has held for longer than a lease, as this process's ownership rounds saw them.",
    (s) => s.partitionsUnowned()
  )
  gauge("quota_events_pending", "Events recorded and not yet published.", (s) => s.eventsPending())
  gauge(
    "quota_clock_offset_seconds",
    "This process's wall clock minus Postgres's clock, as last measured (positive: ahead).",
    (s) => s.clockOffsetMs() / 1_000
  )
  gauge(
    "quota_clock_offset_beyond_max",
    "1 while the clock's offset from Postgres's is beyond QUOTA_CLOCK_OFFSET_MAX_MS: serving nothing.",
    (s) => (s.clockBeyondMax() ? 1 : 0)
  )
  gauge(
    "quota_postgres_synchronous_standbys",
    "The primary's synchronous standbys (pg_stat_replication sync or quorum). 0: an acknowledged grant may be lost with the primary.",
    (s) => s.postgresSynchronousStandbys()
  )

  const recorder: MetricsRecorder = {
    commandAnswered: (op, status, seconds) => {
      const opCell = operationIndex(op)
      const statusCell = statusIndex(status)
      // A status outside the protocol's list is a bug elsewhere; it is not worth a series of its own.
      if (statusCell >= 0) commands[opCell * statusLabels.length + statusCell]! += 1
      commandDuration.record(opCell, seconds)
    },
    storeCommitted: (seconds, ok) => {
      storeCommitDuration.record(0, seconds)
      if (!ok) storeCommitsFailed[0]! += 1
    },
    writeFenced: () => {
      fencedWrites[0]! += 1
    },
    holdExpired: (meter) => {
      holdsExpired[meterIndex(meter)]! += 1
    },
    slotBusy: (plan) => {
      slotsBusy[planIndex(plan)]! += 1
    },
    eventPublished: (kind, duplicate) => {
      if (duplicate) {
        eventsRepublished[0]! += 1
        return
      }
      const cell = eventKindIndex(kind)
      if (cell >= 0) eventsPublished[cell]! += 1
    }
  }

  return {
    registry,
    recorder,
    setGaugeSources: (partial) => {
      sources = { ...sources, ...partial }
    },
    scrape: async () => ({ contentType: registry.contentType, body: await registry.metrics() })
  }
}
