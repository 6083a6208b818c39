/**
 * Prefix and partitions from the environment and from the running coordinator (issue 30 item 5):
 * QUOTA_PREFIX and QUOTA_PARTITIONS fill in what the options leave out, `discover` learns them from
 * the coordinator's `$SRV.INFO` metadata, options win over the environment, and a value that differs
 * from the coordinator's fails the connect naming both.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import {
  CoordinatorDisagrees,
  DiscoveryFailed,
  QuotaClient,
  SettingsInvalid,
  discoverCoordinators
} from "../../src/client/index.js"
import type { Harness } from "../transport/support.js"
import { randomPrefix, startHarness } from "../transport/support.js"

let harness: Harness
beforeAll(async () => {
  // 5 partitions: neither the client's default (64) nor the harness's usual 8.
  harness = await startHarness({ label: "subjects", partitions: 5 })
})
afterAll(async () => {
  await harness.close()
})

const connected = async (options: Parameters<typeof QuotaClient.connect>[0]) => {
  const client = await QuotaClient.connect({ nc: harness.client, ...options })
  const user = "settings-user"
  const subject = client.subjectOf(user)
  const reserve = await client.reserve({ user, meter: "analysis", amount: 1, id: randomPrefix("h") })
  await client.close()
  return { subject, status: reserve.status }
}

describe("subject settings", () => {
  it("reads QUOTA_PREFIX and QUOTA_PARTITIONS from env when the options leave them out", async () => {
    const env = { QUOTA_PREFIX: harness.prefix, QUOTA_PARTITIONS: String(harness.partitions) }
    expect(await connected({ env, timeoutMs: 500, retry: { attemptsMax: 1 } })).toEqual({
      subject: harness.subject("settings-user"),
      status: "reserved"
    })
  })

  it("lets options win over env, and refuses a bad QUOTA_PARTITIONS naming it", async () => {
    const env = { QUOTA_PREFIX: "elsewhere", QUOTA_PARTITIONS: "3" }
    expect(await connected({ env, prefix: harness.prefix, partitions: harness.partitions })).toEqual({
      subject: harness.subject("settings-user"),
      status: "reserved"
    })
    const error = await QuotaClient.connect({ nc: harness.client, env: { QUOTA_PARTITIONS: "0" } }).catch(
      (e: unknown) => e
    )
    expect(error).toBeInstanceOf(SettingsInvalid)
    expect(error).toMatchObject({ variable: "QUOTA_PARTITIONS" })
  })

  it("learns the partitions from the coordinator's $SRV.INFO metadata", async () => {
    const mine = (await discoverCoordinators(harness.client)).filter((info) => info.prefix === harness.prefix)
    expect(mine.map(({ prefix, partitions }) => ({ prefix, partitions }))).toEqual([
      { prefix: harness.prefix, partitions: 5 }
    ])
    expect(await connected({ prefix: harness.prefix, discover: true })).toEqual({
      subject: harness.subject("settings-user"),
      status: "reserved"
    })
  })

  it("fails the connect when a setting disagrees with the coordinator, naming both and the source", async () => {
    const fromOption = await QuotaClient.connect({
      nc: harness.client,
      prefix: harness.prefix,
      partitions: 64,
      discover: true
    }).catch((e: unknown) => e)
    expect(fromOption).toBeInstanceOf(CoordinatorDisagrees)
    expect(fromOption).toMatchObject({
      setting: "partitions",
      client: 64,
      source: "option partitions",
      coordinator: 5
    })
    const fromEnv = await QuotaClient.connect({
      nc: harness.client,
      env: { QUOTA_PREFIX: harness.prefix, QUOTA_PARTITIONS: "16" },
      discover: true
    }).catch((e: unknown) => e)
    expect((fromEnv as Error).message).toMatch(
      /^quota: partitions 16 \(from QUOTA_PARTITIONS\) disagrees with the running coordinator's 5 /
    )
    const noSuchPrefix = await QuotaClient.connect({
      nc: harness.client,
      prefix: randomPrefix("absent"),
      discover: true
    }).catch((e: unknown) => e)
    expect(noSuchPrefix).toBeInstanceOf(DiscoveryFailed)
  })
})
