/** What the report says about where it ran, and on which code. */
import { execFileSync } from "node:child_process"
import os from "node:os"

export interface MachineInfo {
  readonly cpuModel: string
  readonly cores: number
  readonly memoryGiB: number
  readonly node: string
  readonly platform: string
  /** The commit measured, and whether the working tree differed from it (results name their code). */
  readonly code: string
}

const git = (args: ReadonlyArray<string>): string =>
  execFileSync("git", args, { encoding: "utf8", stdio: ["ignore", "pipe", "ignore"] }).trim()

const codeMeasured = (): string => {
  try {
    const commit = git(["rev-parse", "--short", "HEAD"])
    const changed = git(["status", "--porcelain", "--untracked-files=no"]) !== ""
    return changed ? `commit ${commit} with uncommitted changes` : `commit ${commit}`
  } catch {
    return "unknown (not a git checkout)"
  }
}

export const machineInfo = (): MachineInfo => ({
  cpuModel: os.cpus()[0]?.model.trim() ?? "unknown",
  cores: os.cpus().length,
  memoryGiB: Math.round((os.totalmem() / 2 ** 30) * 10) / 10,
  node: process.version,
  platform: `${os.type()} ${os.release()} ${os.arch()}`,
  code: codeMeasured()
})
