/** src/config/configFile.ts: the QUOTA_CONFIG shape, each refusal naming its path, fairness applied. */
import { mkdtempSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Effect } from "effect"
import { describe, expect, it } from "vitest"
import { loadConfig, parseConfigFile, withFairness } from "../../src/config/configFile.js"
import type { FairnessSettings } from "../../src/config/settings.js"
import { defaultConfig, planLimit, planNamed } from "../../src/domain/config.js"

const fairness: FairnessSettings = {
  enabled: true,
  slotOverrides: {},
  snoozeBaseMs: 30_000,
  snoozeJitterMs: 10_000
}

const valid = {
  meters: { analysis: { period: "month" }, tokens: { period: "day" }, storage_bytes: { period: "none" } },
  plans: {
    free: { slots: 1, limits: { analysis: 5, tokens: 400_000 } },
    pro: { slots: 3, limits: { analysis: 50, storage_bytes: Number.MAX_SAFE_INTEGER } }
  },
  defaultPlan: "free"
}

describe("parseConfigFile", () => {
  it("keeps the meters in file order and the plans as given", () => {
    expect(parseConfigFile(valid)).toEqual({
      ok: {
        meters: [
          { name: "analysis", period: "month" },
          { name: "tokens", period: "day" },
          { name: "storage_bytes", period: "none" }
        ],
        plans: valid.plans,
        defaultPlan: "free"
      }
    })
  })

  it("keeps plans named like JavaScript object properties as plans, and only those", () => {
    // Parsed from text, as a file is: JSON.parse makes `__proto__` an own key (a literal would not).
    const parsed = parseConfigFile(
      JSON.parse(
        '{"meters":{"analysis":{"period":"month"}},"plans":{"__proto__":{"slots":2,"limits":{"analysis":7}},"constructor":{"slots":4}},"defaultPlan":"__proto__"}'
      )
    )
    if (!("ok" in parsed)) throw new Error(JSON.stringify(parsed))
    const config = withFairness(parsed.ok, fairness)
    expect(Object.keys(config.plans).sort()).toEqual(["__proto__", "constructor"])
    expect(planNamed(config, "__proto__")).toEqual({ slots: 2, limits: { analysis: 7 } })
    expect(planNamed(config, "constructor")).toEqual({ slots: 4, limits: {} })
    expect(planNamed(config, "toString")).toBeUndefined()
    expect(planLimit(planNamed(config, "constructor")!, "analysis")).toBe(0)
    expect(parseConfigFile({ ...valid, defaultPlan: "toString" })).toEqual({
      refused: { path: "defaultPlan", reason: 'plan "toString" is not in plans' }
    })
  })

  it("keeps a meter's thresholds ascending, [] as none, and no field where the file lists none", () => {
    const meters = {
      analysis: { period: "month", thresholds: [1, 0.5] },
      tokens: { period: "day", thresholds: [] },
      storage_bytes: { period: "none", thresholds: [2, 0.8, 1.25, 1] },
      specview: { period: "month" }
    }
    const parsed = parseConfigFile({
      ...valid,
      meters
    })
    expect(parsed).toEqual({
      ok: {
        meters: [
          { name: "analysis", period: "month", thresholds: [0.5, 1] },
          { name: "tokens", period: "day", thresholds: [] },
          { name: "storage_bytes", period: "none", thresholds: [0.8, 1, 1.25, 2] },
          { name: "specview", period: "month" }
        ],
        plans: valid.plans,
        defaultPlan: "free"
      }
    })
    // The file's own array is left as it was.
    expect(meters.analysis.thresholds).toEqual([1, 0.5])
  })

  it("defaults defaultPlan to free and a plan's limits to none", () => {
    const { defaultPlan: _unused, ...withoutDefault } = valid
    expect(parseConfigFile({ ...withoutDefault, plans: { free: { slots: 0 } } })).toMatchObject({
      ok: { defaultPlan: "free", plans: { free: { slots: 0, limits: {} } } }
    })
  })

  const refusals: Array<[string, unknown, string, string]> = [
    ["not an object", [], "", "must be an object"],
    ["missing meters", { plans: valid.plans }, "meters", "required"],
    [
      "bad meter name",
      { ...valid, meters: { Tokens: { period: "month" } } },
      "meters.Tokens",
      "meter name must match"
    ],
    [
      "bad period",
      { ...valid, meters: { tokens: { period: "week" } } },
      "meters.tokens.period",
      'must be "month"'
    ],
    ["meter not an object", { ...valid, meters: { tokens: "month" } }, "meters.tokens", "must be an object"],
    ["missing plans", { meters: valid.meters }, "plans", "required"],
    ["no plans", { ...valid, plans: {} }, "plans", "must name at least one plan"],
    ["slots missing", { ...valid, plans: { free: { limits: {} } } }, "plans.free.slots", "required"],
    [
      "slots negative",
      { ...valid, plans: { free: { slots: -1 } } },
      "plans.free.slots",
      "must be an integer"
    ],
    [
      "slots fractional",
      { ...valid, plans: { free: { slots: 1.5 } } },
      "plans.free.slots",
      "must be an integer"
    ],
    [
      "limit too large",
      { ...valid, plans: { free: { slots: 1, limits: { tokens: 2 ** 53 } } } },
      "plans.free.limits.tokens",
      "must be an integer from 0 to 9007199254740991"
    ],
    [
      "limit a string",
      { ...valid, plans: { free: { slots: 1, limits: { tokens: "10" } } } },
      "plans.free.limits.tokens",
      "must be an integer"
    ],
    [
      "limit of an unknown meter",
      { ...valid, plans: { free: { slots: 1, limits: { pages: 1 } } } },
      "plans.free.limits.pages",
      "not a meter of this configuration"
    ],
    [
      "typo in a plan",
      { ...valid, plans: { free: { slots: 1, limit: {} } } },
      "plans.free.limit",
      "unknown field"
    ],
    ["unknown top-level field", { ...valid, meter: {} }, "meter", "unknown field"],
    [
      "defaultPlan missing from plans",
      { ...valid, defaultPlan: "gold" },
      "defaultPlan",
      'plan "gold" is not in plans'
    ],
    ["defaultPlan not a string", { ...valid, defaultPlan: 1 }, "defaultPlan", "must be a string"],
    ...(
      [
        ["thresholds not an array (a number)", 0.8, "meters.analysis.thresholds", "must be an array"],
        ["thresholds not an array (a string)", "0.8, 1", "meters.analysis.thresholds", "must be an array"],
        ["thresholds not an array (an object)", { 0: 0.8 }, "meters.analysis.thresholds", "must be an array"],
        [
          "more than 4 thresholds",
          [0.2, 0.4, 0.6, 0.8, 1],
          "meters.analysis.thresholds",
          "at most 4 thresholds"
        ],
        ["a repeated threshold", [0.8, 1, 0.8], "meters.analysis.thresholds", "must not repeat"],
        ["a threshold of 0", [0.5, 0], "meters.analysis.thresholds.1", "must be a number above 0"],
        ["a negative threshold", [-0.8], "meters.analysis.thresholds.0", "must be a number above 0"],
        ["a threshold as a string", [0.5, "0.8"], "meters.analysis.thresholds.1", "must be a number above 0"],
        ["NaN as a string", ["NaN"], "meters.analysis.thresholds.0", "must be a number above 0"],
        ["NaN (not from JSON)", [Number.NaN], "meters.analysis.thresholds.0", "must be a number above 0"],
        ["Infinity (not from JSON)", [Infinity], "meters.analysis.thresholds.0", "must be a number above 0"],
        ["a null threshold", [0.5, 1, null], "meters.analysis.thresholds.2", "must be a number above 0"]
      ] as Array<[string, unknown, string, string]>
    ).map(([name, thresholds, path, reason]): [string, unknown, string, string] => [
      name,
      { ...valid, meters: { ...valid.meters, analysis: { period: "month", thresholds } } },
      path,
      reason
    ])
  ]
  it.each(refusals)("refuses %s at %s", (_name, json, path, reason) => {
    const parsed = parseConfigFile(json)
    expect(parsed).toHaveProperty("refused")
    if ("refused" in parsed) {
      expect(parsed.refused.path).toBe(path)
      expect(parsed.refused.reason).toContain(reason)
    }
  })
})

describe("loadConfig", () => {
  const directory = mkdtempSync(join(tmpdir(), "quota-config-"))
  const file = (name: string, text: string) => {
    const path = join(directory, name)
    writeFileSync(path, text)
    return path
  }

  it("uses the built-in default without a file, with the environment's fairness", async () => {
    const config = await Effect.runPromise(
      loadConfig(undefined, { enabled: false, slotOverrides: { pro: 7 }, snoozeBaseMs: 1, snoozeJitterMs: 2 })
    )
    expect(config.meters).toEqual(defaultConfig.meters)
    expect(config.plans["pro"]?.slots).toBe(7)
    expect(config.plans["free"]?.slots).toBe(1)
    expect(config.fairness).toEqual({ enabled: false, snoozeBaseMs: 1, snoozeJitterMs: 2 })
  })

  it("reads a file and lets FAIRNESS_*_LIMIT override slots of plans it has", async () => {
    const config = await Effect.runPromise(
      loadConfig(file("ok.json", JSON.stringify(valid)), {
        ...fairness,
        slotOverrides: { free: 4, enterprise: 9 }
      })
    )
    expect(config.plans["free"]).toEqual({ slots: 4, limits: { analysis: 5, tokens: 400_000 } })
    expect(config.plans["enterprise"]).toBeUndefined()
    expect(config.defaultPlan).toBe("free")
  })

  it("reads thresholds from a file, ascending, and refuses a bad one naming its index", async () => {
    const meters = { ...valid.meters, tokens: { period: "day", thresholds: [1.25, 0.5] } }
    const config = await Effect.runPromise(
      loadConfig(file("thresholds.json", JSON.stringify({ ...valid, meters })), fairness)
    )
    expect(config.meters.find((meter) => meter.name === "tokens")?.thresholds).toEqual([0.5, 1.25])
    const badPath = file(
      "bad-thresholds.json",
      JSON.stringify({ ...valid, meters: { ...meters, tokens: { period: "day", thresholds: [0.5, "NaN"] } } })
    )
    const bad = await Effect.runPromise(Effect.flip(loadConfig(badPath, fairness)))
    expect(bad.message).toBe(`${badPath}: meters.tokens.thresholds.1: must be a number above 0, got "NaN"`)
  })

  it("refuses a missing file, a file that is not JSON, and a wrong shape, naming file and path", async () => {
    const missing = await Effect.runPromise(Effect.flip(loadConfig(join(directory, "none.json"), fairness)))
    expect(missing.message).toContain("cannot be read")
    const garbled = await Effect.runPromise(Effect.flip(loadConfig(file("bad.json", "{meters"), fairness)))
    expect(garbled.message).toContain("is not JSON")
    const shapePath = file("shape.json", JSON.stringify({ ...valid, defaultPlan: "gold" }))
    const shape = await Effect.runPromise(Effect.flip(loadConfig(shapePath, fairness)))
    expect(shape._tag).toBe("ConfigFileInvalid")
    expect(shape.message).toBe(`${shapePath}: defaultPlan: plan "gold" is not in plans`)
  })
})
