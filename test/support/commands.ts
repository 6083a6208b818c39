/** Commands as the store tests send them (meter `analysis`, holds that outlive the test). */
import type { Command } from "../../src/domain/commands.js"
import type { Result } from "../../src/domain/results.js"

export const reserveCommand = (user: string, id: string, amount = 1): Command => ({
  op: "reserve",
  user,
  meter: "analysis",
  amount,
  id,
  ttlMs: 600_000
})

export const commitCommand = (user: string, id: string): Command => ({
  op: "commit",
  user,
  id,
  amount: undefined
})

/** As a client does: `unavailable` is retried with the same id, up to 5 attempts in all. */
export const retryingUnavailable =
  (submit: (command: Command) => Promise<Result>) =>
  async (command: Command): Promise<Result> => {
    for (let attempt = 1; ; attempt += 1) {
      const result = await submit(command)
      if (result.status !== "unavailable" || attempt === 5) return result
    }
  }
