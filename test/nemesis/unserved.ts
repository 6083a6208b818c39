/**
 * Unserved time per partition, as a checked bound (issue 34 item 4). A probe per partition asks every
 * `probeIntervalMs` about a user nobody has seen (`get_usage` straight over NATS, no SDK retries): only a
 * process that owns the partition and can load from Postgres answers it `ok`. A stretch between two
 * `ok`s is time the partition went unserved.
 *
 * The bound: after a single fault, a partition is served again within a lease plus an ownership round
 * (its owner's lease runs out at most a lease after its last renewal; another member claims it at its
 * next round, a third of a lease later). For a fault that took away a server every process needs (a
 * Postgres failover or restart, a NATS restart) nobody can answer while it is away, so the bound counts
 * from when it was back. The probe's own resolution (an interval and a timeout) and a scheduling margin
 * are added. Where several faults are in play, the bound counts from the last of them to begin (or its
 * server's return): each fault may restart the wait, none may make it longer than the bound after it.
 */
import type { NatsConnection } from "@nats-io/transport-node"
import { connect } from "@nats-io/transport-node"
import { probePartition, sleep } from "../cluster/cluster.js"

const probeIntervalMs = 250
const probeTimeoutMs = 500
/** The probe's resolution and a margin for a busy 2-core machine's scheduling. */
export const unservedSlackMs = probeIntervalMs + probeTimeoutMs + 250

export interface UnservedWatch {
  /** Per partition, the send times (ms since the epoch) of the probes answered `ok`. */
  readonly stop: () => Promise<Map<number, Array<number>>>
}

export const watchUnserved = async (
  servers: string,
  prefix: string,
  partitions: number
): Promise<UnservedWatch> => {
  const nc: NatsConnection = await connect({ servers, name: "nemesis-probe", maxReconnectAttempts: -1 })
  const oks = new Map<number, Array<number>>(Array.from({ length: partitions }, (_, p) => [p, []]))
  let running = true
  const loops = Promise.all(
    Array.from({ length: partitions }, async (_, partition) => {
      // Each probe about a fresh user (`nemp-<partition>-<round>-<k>`): memory cannot answer it.
      for (let round = 1; running; round += 1) {
        const sentAt = Date.now()
        if (await probePartition(nc, prefix, partition, partitions, probeTimeoutMs, round))
          oks.get(partition)!.push(sentAt)
        await sleep(Math.max(0, probeIntervalMs - (Date.now() - sentAt)))
      }
    })
  )
  return {
    stop: async () => {
      running = false
      await loops
      await nc.close()
      return oks
    }
  }
}

/** A fault as the bound needs it: when it ran (ms from the faults' start) and when its server was back. */
export interface FaultSpan {
  readonly what: string
  readonly startedMs: number
  readonly endedMs: number
  /** For a fault that took a shared server away: when it answered again. */
  readonly backMs?: number
}

export interface UnservedGap {
  readonly partition: number
  readonly fromMs: number
  readonly toMs: number
  readonly ms: number
  /** The faults in play during it (or within a lease and a round before it began). */
  readonly faults: ReadonlyArray<FaultSpan>
}

export interface UnservedReport {
  readonly boundMs: number
  readonly violations: ReadonlyArray<string>
  /** The longest stretch after a single fault (from its server's return where it has one), any partition. */
  readonly longestSingle: UnservedGap | undefined
  /** The longest where several faults were in play, from the last of them to begin. */
  readonly longestOverlapping: UnservedGap | undefined
}

/**
 * Judges every stretch without an `ok` in [fromMs, toMs] (ms from `startedAt`): longer than the bound
 * after the last fault in play began (or its server returned), or after none, it is a violation.
 */
export const judgeUnserved = (
  oks: ReadonlyMap<number, ReadonlyArray<number>>,
  startedAt: number,
  window: { readonly fromMs: number; readonly toMs: number },
  faults: ReadonlyArray<FaultSpan>,
  leaseMs: number
): UnservedReport => {
  const boundMs = leaseMs + Math.round(leaseMs / 3)
  const violations: Array<string> = []
  let longestSingle: UnservedGap | undefined
  let longestOverlapping: UnservedGap | undefined
  for (const [partition, times] of oks) {
    const relative = times.map((time) => time - startedAt).filter((time) => time <= window.toMs)
    let previous = relative.filter((time) => time <= window.fromMs).at(-1) ?? window.fromMs
    for (const time of [...relative.filter((time) => time > window.fromMs), window.toMs]) {
      // Shorter stretches are the probe's own resolution: neither a figure nor a violation.
      if (time - previous > unservedSlackMs) {
        const inPlay = faults.filter(
          (fault) => fault.startedMs <= time && fault.endedMs + boundMs >= previous
        )
        // The bound runs from the last fault in play to begin (its server's return, for a shared one).
        const from = Math.max(previous, ...inPlay.map((fault) => fault.backMs ?? fault.startedMs))
        const gap: UnservedGap = { partition, fromMs: from, toMs: time, ms: time - from, faults: inPlay }
        if (inPlay.length <= 1) {
          if (longestSingle === undefined || gap.ms > longestSingle.ms) longestSingle = gap
        } else if (longestOverlapping === undefined || gap.ms > longestOverlapping.ms)
          longestOverlapping = gap
        const last = inPlay.find((fault) => (fault.backMs ?? fault.startedMs) === from)
        if (gap.ms > boundMs + unservedSlackMs)
          violations.push(
            `partition ${partition} unserved ${gap.ms} ms (+${gap.fromMs}..+${gap.toMs} ms) after ` +
              `${inPlay.length === 0 ? "no fault" : inPlay.length === 1 ? "a single fault" : `the last of ${inPlay.length} faults`}` +
              `${last === undefined ? "" : `: +${last.startedMs} ms ${last.what}`}; ` +
              `bound: a lease and a round, ${boundMs} ms, + ${unservedSlackMs} ms of the probe's resolution`
          )
      }
      previous = time
    }
  }
  return { boundMs, violations, longestSingle, longestOverlapping }
}
