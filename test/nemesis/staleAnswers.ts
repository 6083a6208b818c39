/**
 * Answers from stale memory, as the processes' own logs tell them (the check of the cluster tests'
 * `staleAnswersOf`, for every process): a decided answer (anything but `unavailable`) for a partition
 * that Postgres's `partition_owners` gave to another process all around it. The client may never see
 * such an answer (the owner's reply may arrive first), so the replies alone miss most of them; the
 * logs have every decision. Issue 34 item 3 is this: a member that lost and retook its lock keeps
 * answering for partitions another claimed from it.
 *
 * Ownership is sampled from Postgres every `samplePeriodMs` on its clock (a process logs its claim only
 * once it serves, after it may have begun to answer, so its log cannot say when it began). An answer
 * is stale when every sample within the tolerance of it (the clocks' bound and a margin: a log time is
 * its process's clock) names another owner, the samples are close enough to leave no ownership unseen
 * between them, and the epoch moved by one at most between two of them.
 *
 * A process stopped by the nemesis logs, right after it resumes, the answers of groups it decided before
 * it stopped: a group's replies, refusals and reads included, wait for its write, whose commit landed
 * meanwhile, before any claim could (a claim skips rows a write in flight holds). The log cannot tell
 * those from decisions made after the resume, so a stopped process's answers are not counted for a
 * second after it resumes; a process stopped past its lease must answer nothing from memory after that
 * either, and the model judges every reply a client received.
 */
import type pg from "pg"
import { partitionOf } from "../../src/domain/partition.js"
import { logEntries, sleep } from "../cluster/cluster.js"
import type { AppliedFault } from "./nemesis.js"
import type { NemesisWorld } from "./world.js"
import { ownerOfServe } from "./world.js"

/** A process stopped and resumed by the nemesis: world ms. */
export interface PauseSpan {
  readonly member: number
  readonly resumedAt: number
}

/**
 * A process's clock shifted by the nemesis, [from, to] in world ms: its log times are off by
 * `offsetMs` then, and by either that or nothing for a second at each end (libfaketime reads its file
 * at most every second).
 */
export interface ClockSpan {
  readonly member: number
  readonly from: number
  readonly to: number
  readonly offsetMs: number
}

/** The pauses and clock offsets the nemesis applied to processes, in world ms (`zero`: the faults' +0). */
export const processFaultSpans = (
  applied: ReadonlyArray<AppliedFault>,
  zero: number
): { pauses: Array<PauseSpan>; clocks: Array<ClockSpan> } => ({
  pauses: applied
    .filter((fault) => fault.kind === "pause" || fault.kind === "stepDownPause")
    .map((fault) => ({ member: fault.member, resumedAt: zero + fault.endedMs })),
  clocks: applied
    .filter((fault) => fault.kind === "clock" || fault.kind === "clockBeyond")
    .map((fault) => ({
      member: fault.member,
      from: zero + fault.startedMs,
      to: zero + fault.endedMs,
      offsetMs: fault.level
    }))
})

/** How long libfaketime may take to read a process's new offset (FAKETIME_CACHE_DURATION). */
const clockReadMs = 1_000

const samplePeriodMs = 100
/** Two samples further apart than this leave room for an ownership nobody saw: nothing is judged there. */
const sampleGapMsMax = 400
const resumeWindowMs = 1_000

interface OwnershipSample {
  /** Postgres's clock (world ms). */
  readonly at: number
  readonly owners: ReadonlyMap<number, { readonly owner: string; readonly epoch: number }>
}

export interface OwnershipWatch {
  readonly stop: () => Promise<ReadonlyArray<OwnershipSample>>
}

export const watchOwnership = (pool: pg.Pool): OwnershipWatch => {
  const samples: Array<OwnershipSample> = []
  let running = true
  const loop = (async () => {
    while (running) {
      const started = Date.now()
      const result = await pool
        .query<{ at: string; partition: number; owner: string; epoch: string }>(
          `select (extract(epoch from clock_timestamp()) * 1000)::bigint::text as at, partition, owner,
                  epoch::text from quota.partition_owners`
        )
        .catch(() => undefined)
      if (result !== undefined && result.rows.length > 0)
        samples.push({
          at: Number(result.rows[0]!.at),
          owners: new Map(
            result.rows.map((row) => [row.partition, { owner: row.owner, epoch: Number(row.epoch) }])
          )
        })
      await sleep(Math.max(0, samplePeriodMs - (Date.now() - started)))
    }
  })()
  return {
    stop: async () => {
      running = false
      await loop
      return samples
    }
  }
}

/** Binary search: the index of the first sample at or after `at`. */
const firstFrom = (samples: ReadonlyArray<OwnershipSample>, at: number): number => {
  let low = 0
  let high = samples.length
  while (low < high) {
    const middle = (low + high) >> 1
    if (samples[middle]!.at < at) low = middle + 1
    else high = middle
  }
  return low
}

export const staleAnswers = (
  world: NemesisWorld,
  samples: ReadonlyArray<OwnershipSample>,
  pauses: ReadonlyArray<PauseSpan>,
  clocks: ReadonlyArray<ClockSpan>,
  startedAt: number
): { readonly count: number; readonly examples: ReadonlyArray<string> } => {
  // An answer's time is its process's clock: within the bound of Postgres's while it may serve, and
  // as far off as the nemesis set it (give or take libfaketime's second) while a clock fault ran.
  const baseToleranceMs = world.clockOffsetMaxMs + 200
  const toleranceOf = (member: number, time: number): number =>
    Math.max(
      baseToleranceMs,
      ...clocks
        .filter((clock) => clock.member === member)
        .map((clock) => {
          const widenMs = Math.abs(clock.offsetMs) + clockReadMs
          return time >= clock.from - widenMs - baseToleranceMs &&
            time <= clock.to + widenMs + baseToleranceMs
            ? baseToleranceMs + widenMs
            : 0
        })
    )
  const examples: Array<string> = []
  let count = 0
  const relative = (time: number) => time - world.worldOffsetMs - startedAt
  for (const member of world.members)
    member.incarnations.forEach((serve, incarnation) => {
      const owner = ownerOfServe(serve)
      if (owner === undefined) return
      for (const entry of logEntries(serve)) {
        const { op, user, status } = entry as { op?: unknown; user?: unknown; status?: unknown }
        if (typeof op !== "string" || typeof user !== "string" || status === "unavailable") continue
        const toleranceMs = toleranceOf(member.index, entry.time)
        const resumed = pauses.some(
          (pause) =>
            pause.member === member.index &&
            entry.time + toleranceMs >= pause.resumedAt &&
            entry.time - toleranceMs <= pause.resumedAt + resumeWindowMs
        )
        if (resumed) continue
        const partition = partitionOf(user, world.partitions)
        const from = firstFrom(samples, entry.time - toleranceMs)
        const around = samples.slice(Math.max(0, from - 1), firstFrom(samples, entry.time + toleranceMs) + 1)
        if (
          around.length < 2 ||
          around[0]!.at > entry.time - toleranceMs ||
          around.at(-1)!.at < entry.time + toleranceMs
        )
          continue
        const seen = around.map((sample) => sample.owners.get(partition))
        const unseen = around.some(
          (sample, index) =>
            index > 0 &&
            (sample.at - around[index - 1]!.at > sampleGapMsMax ||
              (seen[index]?.epoch ?? 0) - (seen[index - 1]?.epoch ?? 0) > 1)
        )
        if (unseen || seen.some((row) => row?.owner === owner)) continue
        count += 1
        if (examples.length < 20)
          examples.push(
            `m${member.index}#${incarnation} answered ${op} ${String(status)} for ${user} (partition ${partition}) at ` +
              `+${relative(entry.time)} ms, while Postgres gave the partition to ` +
              `${[...new Set(seen.map((row) => `${row?.owner ?? "nobody"} (epoch ${row?.epoch ?? "-"})`))].join(", ")} ` +
              `all around it (±${toleranceOf(member.index, entry.time)} ms)`
          )
      }
    })
  return { count, examples }
}
