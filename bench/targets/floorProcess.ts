/**
 * Starts the floor of issue 27 (floorServer.ts) as its own process, as the coordinator runs, on a
 * database of its own created for this bench run and dropped after.
 */
import type { CoordinatorProcess } from "./coordinatorProcess.js"
import { startEchoProcess } from "./echoProcess.js"
import { createDatabase, databaseUrl } from "./pgCommon.js"

/** Where the floor answers and what it runs on, as for the coordinator (its output is not kept). */
export type FloorProcess = Omit<CoordinatorProcess, "output">

export const startFloor = async (
  root: string,
  namespace: string,
  partitions: number
): Promise<FloorProcess> => {
  const prefix = `bench_floor_${namespace}`
  const database = `bench_floor_${namespace}`
  const dropDatabase = await createDatabase(database)
  try {
    const server = await startEchoProcess(root, "floorServer.ts", [
      prefix,
      databaseUrl(database),
      String(partitions)
    ])
    return {
      prefix,
      partitions,
      database,
      pid: server.pid,
      stop: async () => {
        await server.stop()
        await dropDatabase().catch(() => undefined)
      }
    }
  } catch (error) {
    await dropDatabase().catch(() => undefined)
    throw error
  }
}
