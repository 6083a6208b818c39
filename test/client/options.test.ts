/** Client settings: checked at construction; the backoff is capped, grows, and takes its jitter from the injected source. */
import fc from "fast-check"
import { describe, expect, it } from "vitest"
import { resolveOptions, retryDelayMs } from "../../src/client/options.js"
import { batchCommandsMax } from "../../src/domain/limits.js"

const policy = { attemptsMax: 10, baseDelayMs: 100, delayMsMax: 1_000 }

describe("retryDelayMs", () => {
  it("doubles per attempt up to delayMsMax, half of it jittered by the injected random source", () => {
    expect([1, 2, 3, 4, 5, 30].map((attempts) => retryDelayMs(attempts, policy, () => 0))).toEqual([
      50, 100, 200, 400, 500, 500
    ])
    expect([1, 2, 3, 4, 5, 30].map((attempts) => retryDelayMs(attempts, policy, () => 0.999_999))).toEqual(
      [100, 200, 400, 800, 1_000, 1_000].map((ms) => expect.closeTo(ms, 2))
    )
  })

  it("stays within [ceiling/2, ceiling] for any attempt and random value", () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 1, max: 2_000 }),
        fc.double({ min: 0, max: 1, maxExcluded: true, noNaN: true }),
        (n, r) => {
          const ceilingMs = Math.min(policy.delayMsMax, policy.baseDelayMs * 2 ** (n - 1))
          const delayMs = retryDelayMs(n, policy, () => r)
          return delayMs >= ceilingMs / 2 && delayMs < ceilingMs + 1e-9 && Number.isFinite(delayMs)
        }
      )
    )
  })
})

describe("resolveOptions", () => {
  it("applies the protocol's defaults", () => {
    const resolved = resolveOptions({})
    expect(resolved).toMatchObject({ prefix: "quota", partitions: 64, batchCommandsMax })
    expect(resolved.retry.attemptsMax).toBeGreaterThan(1)
  })

  it("refuses settings that would break the protocol", () => {
    expect(() => resolveOptions({ batchCommandsMax: batchCommandsMax + 1 })).toThrow(RangeError)
    expect(() => resolveOptions({ batchCommandsMax: 0 })).toThrow(RangeError)
    expect(() => resolveOptions({ partitions: 0 })).toThrow(RangeError)
    expect(() => resolveOptions({ partitions: 2.5 })).toThrow(RangeError)
    expect(() => resolveOptions({ prefix: "quota.*" })).toThrow(RangeError)
    expect(() => resolveOptions({ prefix: "" })).toThrow(RangeError)
    expect(() => resolveOptions({ retry: { attemptsMax: 0 } })).toThrow(RangeError)
    expect(() => resolveOptions({ retry: { baseDelayMs: 500, delayMsMax: 100 } })).toThrow(RangeError)
    expect(resolveOptions({ prefix: "team.quota" }).prefix).toBe("team.quota")
  })
})
