/**
 * Starts one of the bench's far sides for the floors (echoServer.ts, durableEchoServer.ts) as its own
 * process, as the coordinator runs, and waits until it prints "ready".
 */
import type { ChildProcess } from "node:child_process"
import { spawn } from "node:child_process"
import { join } from "node:path"
import { setTimeout as sleep } from "node:timers/promises"

export interface EchoProcess {
  readonly pid: number
  readonly stop: () => Promise<void>
}

/** Runs `bench/<script>` with `args` from `root` (the repository). */
export const startEchoProcess = async (
  root: string,
  script: string,
  args: ReadonlyArray<string>
): Promise<EchoProcess> => {
  const child: ChildProcess = spawn(process.execPath, ["--import", "tsx", join("bench", script), ...args], {
    cwd: root,
    stdio: ["ignore", "pipe", "pipe"]
  })
  const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()))
  await new Promise<void>((resolve, reject) => {
    let text = ""
    child.stdout?.on("data", (chunk: Buffer) => {
      text += chunk.toString()
      if (text.includes("ready")) resolve()
    })
    child.stderr?.on("data", (chunk: Buffer) => {
      text += chunk.toString()
    })
    void exited.then(() => reject(new Error(`${script} exited: ${text}`)))
  })
  return {
    pid: child.pid ?? -1,
    stop: async () => {
      child.kill("SIGTERM")
      await Promise.race([exited, sleep(5_000)])
      if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL")
    }
  }
}
