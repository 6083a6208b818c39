/**
 * The nemesis's own nats-server (JetStream, the deployed ping settings), restartable on the same port
 * and store directory: a restart keeps the events stream and its duplicate window's ids (JetStream
 * recovers both from its files), as a server restarted by an operator or a crash does.
 */
import { join } from "node:path"
import type { NatsServerProcess } from "../support/natsServerProcess.js"
import { startNatsServer } from "../support/natsServerProcess.js"

export interface NemesisNats {
  readonly port: number
  readonly url: string
  /** The running server's output, and every earlier one's (a restart starts a new one). */
  readonly outputs: () => Array<{ readonly name: string; readonly text: string }>
  /** Stopped (SIGKILL: a crash; SIGTERM: a clean stop), then started again after `downMs`. */
  readonly restart: (how: "kill" | "term", downMs: number) => Promise<void>
  readonly stop: () => Promise<void>
}

export const startNemesisNats = async (dir: string): Promise<NemesisNats> => {
  const config = (port: number) =>
    `listen: 127.0.0.1:${port}\nping_interval: "1s"\nping_max: 2\n` +
    `jetstream { store_dir: "${join(dir, "js")}" }\n`
  const first = await startNatsServer(dir, config)
  const { port } = first
  const incarnations: Array<NatsServerProcess> = [first]
  const restart = async (how: "kill" | "term", downMs: number) => {
    const current = incarnations.at(-1)!
    await (how === "kill" ? current.kill() : current.stop())
    await new Promise((resolve) => setTimeout(resolve, downMs))
    // The same port whatever port startNatsServer picks: the processes' proxies and the load reach it there.
    incarnations.push(await startNatsServer(dir, () => config(port)))
  }
  return {
    port,
    url: `nats://127.0.0.1:${port}`,
    outputs: () =>
      incarnations.map((server, index) => ({
        name: index === 0 ? "nats" : `nats-${index}`,
        text: server.output()
      })),
    restart,
    stop: () => incarnations.at(-1)!.stop()
  }
}
