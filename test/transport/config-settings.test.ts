/** src/config/settings.ts: defaults, each variable's parsing, and a refusal naming the variable. */
import { Effect } from "effect"
import { describe, expect, it } from "vitest"
import type { Environment } from "../../src/config/settings.js"
import { parseDurationMs, readSettings } from "../../src/config/settings.js"

const read = (env: Environment) => Effect.runPromise(readSettings(env))
const refusal = (env: Environment) => Effect.runPromise(Effect.flip(readSettings(env)))

describe("readSettings", () => {
  it("applies the defaults to an empty environment", async () => {
    expect(await read({})).toEqual({
      nats: { servers: ["nats://127.0.0.1:4222"] },
      databaseUrl: undefined,
      configPath: undefined,
      prefix: "quota",
      partitions: 64,
      dataDir: ".data",
      logLevel: "info",
      fairness: { enabled: true, slotOverrides: {}, snoozeBaseMs: 30_000, snoozeJitterMs: 10_000 },
      partitionLeaseMs: 6_000,
      clockOffsetMaxMs: 500,
      httpAddress: { host: "127.0.0.1", port: 9464 },
      events: {
        enabled: true,
        streamName: "QUOTA_EVENTS",
        maxAgeMs: 30 * 86_400_000,
        maxBytes: 1_073_741_824,
        replicas: 1,
        duplicateWindowMs: 120_000,
        outboxPerPartitionMax: 100_000,
        usageRecorded: true
      },
      storeQueryTimeoutMs: 10_000,
      usagePeriodsKept: 36
    })
  })

  it("reads every variable", async () => {
    expect(
      await read({
        NATS_URL: "nats://a:4222,nats://b:4222",
        DATABASE_URL: "postgres://x@y/z",
        QUOTA_CONFIG: "/etc/quota.json",
        QUOTA_PREFIX: "billing.quota",
        QUOTA_PARTITIONS: "1024",
        QUOTA_DATA_DIR: "/var/lib/q",
        LOG_LEVEL: "DEBUG",
        FAIRNESS_ENABLED: "false",
        FAIRNESS_FREE_LIMIT: "2",
        FAIRNESS_PRO_LIMIT: "0",
        FAIRNESS_PRO_PLUS_LIMIT: "4",
        FAIRNESS_ENTERPRISE_LIMIT: "10",
        FAIRNESS_SNOOZE_DURATION: "2m",
        FAIRNESS_SNOOZE_JITTER: "500ms",
        QUOTA_LEASE_MS: "2500",
        QUOTA_HTTP_ADDR: "0.0.0.0:9100",
        QUOTA_EVENTS_ENABLED: "false",
        QUOTA_EVENTS_STREAM: "BILLING-QUOTA-EVENTS",
        QUOTA_EVENTS_MAX_AGE: "7d",
        QUOTA_EVENTS_MAX_BYTES: "2097152",
        QUOTA_EVENTS_REPLICAS: "3",
        QUOTA_EVENTS_DUPLICATE_WINDOW: "10m",
        QUOTA_EVENTS_OUTBOX_MAX: "500",
        QUOTA_CLOCK_OFFSET_MAX_MS: "250",
        QUOTA_STORE_QUERY_TIMEOUT: "1s",
        QUOTA_EVENTS_USAGE_RECORDED: "false",
        QUOTA_USAGE_PERIODS_KEPT: "120"
      })
    ).toEqual({
      nats: { servers: ["nats://a:4222", "nats://b:4222"] },
      databaseUrl: "postgres://x@y/z",
      configPath: "/etc/quota.json",
      prefix: "billing.quota",
      partitions: 1024,
      dataDir: "/var/lib/q",
      logLevel: "debug",
      fairness: {
        enabled: false,
        slotOverrides: { free: 2, pro: 0, pro_plus: 4, enterprise: 10 },
        snoozeBaseMs: 120_000,
        snoozeJitterMs: 500
      },
      partitionLeaseMs: 2_500,
      clockOffsetMaxMs: 250,
      httpAddress: { host: "0.0.0.0", port: 9100 },
      events: {
        enabled: false,
        streamName: "BILLING-QUOTA-EVENTS",
        maxAgeMs: 7 * 86_400_000,
        maxBytes: 2_097_152,
        replicas: 3,
        duplicateWindowMs: 600_000,
        outboxPerPartitionMax: 500,
        usageRecorded: false
      },
      storeQueryTimeoutMs: 1_000,
      usagePeriodsKept: 120
    })
  })

  it("names the events stream after the prefix: upper case, dots as _, then _EVENTS", async () => {
    expect((await read({ QUOTA_PREFIX: "billing.quota" })).events.streamName).toBe("BILLING_QUOTA_EVENTS")
  })

  it.each([
    ["off", undefined],
    ["OFF", undefined],
    ["[::1]:9464", { host: "::1", port: 9464 }],
    ["localhost:0", { host: "localhost", port: 0 }],
    ["metrics.internal:65535", { host: "metrics.internal", port: 65_535 }]
  ])("reads QUOTA_HTTP_ADDR=%s", async (value, address) => {
    expect((await read({ QUOTA_HTTP_ADDR: value })).httpAddress).toEqual(address)
  })

  it("treats an empty variable as unset", async () => {
    expect((await read({ QUOTA_CONFIG: "", QUOTA_PARTITIONS: " " })).partitions).toBe(64)
  })

  it.each([
    ["QUOTA_PARTITIONS", "0"],
    ["QUOTA_PARTITIONS", "1025"],
    ["QUOTA_PARTITIONS", "8.5"],
    ["QUOTA_PARTITIONS", "lots"],
    ["QUOTA_PREFIX", "quota.*"],
    ["QUOTA_PREFIX", "a..b"],
    ["QUOTA_PREFIX", "has space"],
    ["LOG_LEVEL", "loud"],
    ["FAIRNESS_ENABLED", "maybe"],
    ["FAIRNESS_PRO_LIMIT", "-1"],
    ["FAIRNESS_SNOOZE_DURATION", "30 parsecs"],
    ["FAIRNESS_SNOOZE_JITTER", "-5s"],
    ["QUOTA_STORE_QUERY_TIMEOUT", "50ms"],
    ["QUOTA_STORE_QUERY_TIMEOUT", "1h"],
    ["QUOTA_LEASE_MS", "999"],
    ["QUOTA_LEASE_MS", "600001"],
    ["QUOTA_CLOCK_OFFSET_MAX_MS", "9"],
    ["QUOTA_CLOCK_OFFSET_MAX_MS", "60001"],
    ["FAIRNESS_SNOOZE_DURATION", "25h"],
    ["QUOTA_HTTP_ADDR", "9464"],
    ["QUOTA_HTTP_ADDR", "127.0.0.1"],
    ["QUOTA_HTTP_ADDR", "127.0.0.1:65536"],
    ["QUOTA_HTTP_ADDR", "::1:9464"],
    ["QUOTA_HTTP_ADDR", "http://127.0.0.1:9464"],
    ["QUOTA_EVENTS_ENABLED", "sometimes"],
    ["QUOTA_EVENTS_STREAM", "quota.events"],
    ["QUOTA_EVENTS_MAX_AGE", "30 days"],
    ["QUOTA_EVENTS_MAX_BYTES", "1024"],
    ["QUOTA_EVENTS_REPLICAS", "6"],
    ["QUOTA_EVENTS_DUPLICATE_WINDOW", "1m"],
    ["QUOTA_EVENTS_OUTBOX_MAX", "0"],
    ["QUOTA_EVENTS_USAGE_RECORDED", "billing"],
    ["QUOTA_USAGE_PERIODS_KEPT", "35"],
    ["QUOTA_USAGE_PERIODS_KEPT", "1201"]
  ])("refuses %s=%s naming the variable", async (variable, value) => {
    const error = await refusal({ [variable]: value })
    expect(error._tag).toBe("SettingsInvalid")
    expect(error.variable).toBe(variable)
    expect(error.message.startsWith(`${variable}: `)).toBe(true)
  })
})

describe("parseDurationMs", () => {
  it.each([
    ["30s", 30_000],
    ["500ms", 500],
    ["2m", 120_000],
    ["1h", 3_600_000],
    ["1500", 1_500],
    ["0", 0],
    ["10d", 864_000_000]
  ])("%s is %i ms", (text, ms) => {
    expect(parseDurationMs(text)).toBe(ms)
  })

  it.each(["", "s", "1.5s", "-1s", "10w", "1e3"])("refuses %j", (text) => {
    expect(parseDurationMs(text)).toBeUndefined()
  })
})
