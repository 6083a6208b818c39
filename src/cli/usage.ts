/** `usage <user>`: one get_usage over NATS, as any client would send it. */
import { connect } from "@nats-io/transport-node"
import { Effect } from "effect"
import { readSettings } from "../config/settings.js"
import { partitionOf } from "../domain/partition.js"

export const usage = async (env: NodeJS.ProcessEnv, user: string): Promise<unknown> => {
  const settings = await Effect.runPromise(readSettings(env))
  const connection = await connect({ servers: settings.natsUrl.split(",") })
  try {
    const subject = `${settings.prefix}.v1.${partitionOf(user, settings.partitions)}.admin`
    const reply = await connection.request(subject, JSON.stringify({ op: "get_usage", user }), {
      timeout: 5_000
    })
    return reply.json()
  } finally {
    await connection.close()
  }
}
