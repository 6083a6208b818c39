/**
 * What the billing end-to-end tests (revision 1.3) share: a configuration with a meter of each period,
 * users of one partition (non-ASCII among them, so a page of 2 ends mid-partition), and the orders
 * PROTOCOL.md lists them in.
 */
import { mkdtemp, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { partitionOf } from "../../src/domain/partition.js"

/** A meter of each period: `tokens` by month, `renders` by day, `storage_bytes` none. */
export const billingConfig = {
  meters: { tokens: { period: "month" }, renders: { period: "day" }, storage_bytes: { period: "none" } },
  plans: { free: { slots: 1, limits: { tokens: 1_000_000, renders: 1_000, storage_bytes: 1_000_000_000 } } },
  defaultPlan: "free"
}

/** Writes billingConfig to a file of its own; its path is QUOTA_CONFIG. */
export const writeBillingConfig = async (): Promise<string> => {
  const path = join(await mkdtemp(join(tmpdir(), "quota-billing-")), "config.json")
  await writeFile(path, JSON.stringify(billingConfig))
  return path
}

/** The start of the UTC month and day of `at`. */
export const monthStart = (at: number): number =>
  Date.UTC(new Date(at).getUTCFullYear(), new Date(at).getUTCMonth(), 1)
export const dayStart = (at: number): number => at - (at % 86_400_000)

/** `list_usage`'s order: by the users' UTF-8 bytes. */
export const utf8Order = (a: string, b: string): number => Buffer.compare(Buffer.from(a), Buffer.from(b))

/** `report`'s order: by partition, then by the users' UTF-8 bytes. */
export const reportOrder =
  (partitions: number) =>
  (a: string, b: string): number =>
    partitionOf(a, partitions) - partitionOf(b, partitions) || utf8Order(a, b)

/**
 * `count` users of one partition whose names start with characters of 1 to 4 UTF-8 bytes (and
 * U+FFFD, whose UTF-16 order differs from its UTF-8 order against an astral character), plus a few of
 * other partitions.
 */
export const billingUsers = (label: string, partitions: number, count = 6): ReadonlyArray<string> => {
  const starts = ["a", "Z", "é", "ü", "日本", "\u{1F600}", "\uFFFD", "~"]
  const partition = partitionOf(`${starts[0]}-${label}-0`, partitions)
  const same: Array<string> = []
  const others: Array<string> = []
  for (let index = 0; same.length < count || others.length < 3; index++) {
    const user = `${starts[index % starts.length]}-${label}-${index}`
    if (partitionOf(user, partitions) === partition) {
      if (same.length < count) same.push(user)
    } else if (others.length < 3) others.push(user)
  }
  return [...same, ...others]
}
