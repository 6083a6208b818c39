/** What the report says about where it ran. */
import os from "node:os"

export interface MachineInfo {
  readonly cpuModel: string
  readonly cores: number
  readonly memoryGiB: number
  readonly node: string
  readonly platform: string
}

export const machineInfo = (): MachineInfo => ({
  cpuModel: os.cpus()[0]?.model.trim() ?? "unknown",
  cores: os.cpus().length,
  memoryGiB: Math.round((os.totalmem() / 2 ** 30) * 10) / 10,
  node: process.version,
  platform: `${os.type()} ${os.release()} ${os.arch()}`
})
