/**
 * Seed 003's design (ADR-RM-3): a Redis Lua script checks and deducts in one step (EVALSHA), another
 * refunds (never below 0). Reserving deducts the whole amount at once, so `consume` sends nothing and a
 * commit sends a refund only when the work used less than it reserved. Not durable: Redis acknowledges
 * from memory (the report states this server's persistence settings), and the seed resyncs from its
 * database nightly.
 *
 * One change: when the tenant's limit key is absent the reserve script falls back to the limit passed
 * as an argument (the seed reads 0 and refuses), so new hot users need no extra SET.
 */
import { Redis } from "ioredis"
import type { HoldRef, MeterName, StepOutcome, Target } from "./Target.js"
import { makeErrorNote, meterLimits } from "./Target.js"

const reserveScript = `
local current = tonumber(redis.call('GET', KEYS[1]) or 0)
local limit = tonumber(redis.call('GET', KEYS[2]) or ARGV[2])
local reserve_amount = tonumber(ARGV[1])
if current + reserve_amount > limit then
  return {-1, current, limit}
end
local new_usage = redis.call('INCRBY', KEYS[1], reserve_amount)
return {1, new_usage, limit}
`

const refundScript = `
local current = tonumber(redis.call('GET', KEYS[1]) or 0)
local new_usage = math.max(0, current - tonumber(ARGV[1]))
redis.call('SET', KEYS[1], new_usage)
return new_usage
`

const redisUrl = process.env["BENCH_REDIS_URL"] ?? "redis://127.0.0.1:6379"

export const makeSeed003Target = async (namespace: string): Promise<Target> => {
  // One connection: ioredis writes commands as they come and matches replies in order, so every
  // request in flight is pipelined on it.
  const redis = new Redis(redisUrl, { lazyConnect: true, maxRetriesPerRequest: 1 })
  await redis.connect()
  const reserveSha = String(await redis.script("LOAD", reserveScript))
  const refundSha = String(await redis.script("LOAD", refundScript))
  const persistence = (await redis.config("GET", "appendonly")) as Array<string>
  const saving = (await redis.config("GET", "save")) as Array<string>
  const version = /redis_version:(\S+)/.exec(await redis.info("server"))?.[1] ?? "?"
  const errors = makeErrorNote()
  const keyPrefix = `bench:${namespace}:`
  const usedKey = (user: string, meter: MeterName) => `${keyPrefix}${user}:${meter}:used`
  const limitKey = (user: string, meter: MeterName) => `${keyPrefix}${user}:${meter}:limit`
  let requests = 0

  const refund = async (hold: HoldRef, amount: number): Promise<StepOutcome> => {
    if (amount <= 0) return "none"
    requests += 1
    return errors.guard(async () => {
      await redis.evalsha(refundSha, 1, usedKey(hold.user, hold.meter), String(amount))
      return "ok"
    })
  }

  return {
    key: "seed003",
    label: "seed 003: Redis Lua (not durable)",
    durable: false,
    supportsSlots: false,
    notes: [
      `NOT DURABLE: acknowledged from Redis memory (this server: Redis ${version}, appendonly=${persistence[1] ?? "?"}, save="${saving[1] ?? "?"}").`,
      "One ioredis connection (requests in flight are pipelined); reserve = EVALSHA check-and-deduct; commit/release = EVALSHA refund of the unused rest, nothing when there is none; consume sends nothing."
    ],
    prime: async (users: ReadonlyArray<string>, meter: MeterName) => {
      for (let start = 0; start < users.length; start += 1000) {
        const pipeline = redis.pipeline()
        for (const user of users.slice(start, start + 1000)) {
          pipeline.set(limitKey(user, meter), String(meterLimits[meter]))
        }
        await pipeline.exec()
      }
    },
    reserve: (hold) => {
      requests += 1
      return errors.guard(async () => {
        const reply = (await redis.evalsha(
          reserveSha,
          2,
          usedKey(hold.user, hold.meter),
          limitKey(hold.user, hold.meter),
          String(hold.amount),
          String(meterLimits[hold.meter])
        )) as Array<number>
        return reply[0] === 1 ? "ok" : "refused"
      })
    },
    consume: async () => "none",
    commit: (hold, actual) => refund(hold, hold.amount - actual),
    release: (hold) => refund(hold, hold.amount - hold.consumed),
    acquireSlot: async () => "none",
    releaseSlot: async () => "none",
    counters: () => ({ requests, messages: requests }),
    takeError: errors.take,
    close: async () => {
      let cursor = "0"
      do {
        const [next, keys] = await redis.scan(cursor, "MATCH", `${keyPrefix}*`, "COUNT", 1000)
        cursor = next
        if (keys.length > 0) await redis.unlink(...keys)
      } while (cursor !== "0")
      redis.disconnect()
    }
  }
}
