/** Latency histograms (hdr-histogram-js), recorded in microseconds, reported in milliseconds. */
import * as hdr from "hdr-histogram-js"

/** One minute: a request slower than this is recorded as one minute (the histogram's ceiling). */
const latencyUsMax = 60_000_000

export interface LatencySummary {
  readonly count: number
  readonly p50Ms: number
  readonly p99Ms: number
  readonly p999Ms: number
  readonly maxMs: number
}

export interface LatencyRecorder {
  readonly recordMs: (ms: number) => void
  readonly summary: () => LatencySummary
}

export const makeLatencyRecorder = (): LatencyRecorder => {
  const histogram = hdr.build({
    bitBucketSize: 32,
    lowestDiscernibleValue: 1,
    highestTrackableValue: latencyUsMax,
    numberOfSignificantValueDigits: 3,
    autoResize: false
  })
  return {
    recordMs: (ms) => histogram.recordValue(Math.min(latencyUsMax, Math.max(1, Math.round(ms * 1000)))),
    summary: () => ({
      count: histogram.totalCount,
      p50Ms: histogram.getValueAtPercentile(50) / 1000,
      p99Ms: histogram.getValueAtPercentile(99) / 1000,
      p999Ms: histogram.getValueAtPercentile(99.9) / 1000,
      maxMs: histogram.maxValue / 1000
    })
  }
}
