/**
 * A run's latencies over time, for finding stalls a window's percentiles only hint at. Off unless
 * `BENCH_TIMELINE=<file>`: then each run appends one JSON line to the file with its measured requests
 * in `timelineBucketMs` buckets by completion time (wall clock, to line up with the coordinator's GC
 * trace and the Postgres log): requests, slowest, and how many took over `timelineSlowMs`.
 */
import { appendFileSync } from "node:fs"
import { performance } from "node:perf_hooks"

const timelineBucketMs = 50
const timelineSlowMs = 20

export interface TimelineRecorder {
  readonly recordMs: (latencyMs: number) => void
  readonly write: (run: Readonly<Record<string, unknown>>) => void
}

const noTimeline: TimelineRecorder = { recordMs: () => {}, write: () => {} }

export const makeTimelineRecorder = (): TimelineRecorder => {
  const path = process.env["BENCH_TIMELINE"]
  if (path === undefined || path === "") return noTimeline
  // bucket start (wall ms) -> [requests, slowest ms, over timelineSlowMs]
  const buckets = new Map<number, [number, number, number]>()
  return {
    recordMs: (latencyMs) => {
      const completedAtMs = performance.timeOrigin + performance.now()
      const start = Math.floor(completedAtMs / timelineBucketMs) * timelineBucketMs
      const bucket = buckets.get(start) ?? [0, 0, 0]
      bucket[0] += 1
      bucket[1] = Math.max(bucket[1], latencyMs)
      if (latencyMs > timelineSlowMs) bucket[2] += 1
      buckets.set(start, bucket)
    },
    write: (run) => {
      const rows = [...buckets].map(([start, [requests, slowestMs, slow]]) => [
        start,
        requests,
        Math.round(slowestMs * 10) / 10,
        slow
      ])
      appendFileSync(
        path,
        JSON.stringify({ ...run, bucketMs: timelineBucketMs, slowMs: timelineSlowMs, rows }) + "\n"
      )
    }
  }
}
