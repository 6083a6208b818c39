/**
 * Commits of unknown outcome (outcomeDoubts.ts), issue 26 item 1, on the real server:
 * - no write group starts while a doubt recorded before it may still commit: the evidence's 27-71
 *   refusals as duplicates were writes sent while the doubtful backend still ran, ended only after;
 * - a backend is ended only if pid, start and server start all match (a reused pid is someone else);
 * - a write refused because the ledger already holds it is reported as memory behind the database;
 * - (issue 34) once a settle ended a backend, nothing is read before a replication barrier returned,
 *   and a read that a settle overlapped reads again; without a doubt no barrier runs.
 */
import { Effect, Exit } from "effect"
import type pg from "pg"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import type { StoreEvent } from "../../src/domain/events.js"
import { partitionOf } from "../../src/domain/partition.js"
import type { BackendIdentity } from "../../src/store/Fence.js"
import { identifyBackend, makeOutcomeDoubts } from "../../src/store/postgres/outcomeDoubts.js"
import type { PostgresStore } from "../../src/store/postgres/PostgresStore.js"
import { makePostgresStore } from "../../src/store/postgres/PostgresStore.js"
import { waitUntilReplicated } from "../../src/store/postgres/replication.js"
import type { TestSchema } from "../support/database.js"
import { acquireScoped, createTestSchema } from "../support/database.js"
import { heldLock, slowCommitPool, slowFirstCommitOfH10, until } from "../support/slowCommit.js"

describe("commits of unknown outcome", () => {
  let database: TestSchema
  let admin: pg.Pool
  let pool: pg.Pool
  let applicationName: string
  let store: { value: PostgresStore; close: () => Promise<void> }
  /** The lock the slow COMMIT waits for. */
  let lock: Awaited<ReturnType<typeof heldLock>> | undefined

  beforeAll(async () => {
    database = createTestSchema("outcome_doubts")
    admin = database.pool({ max: 3 })
    ;({ pool, applicationName } = await slowCommitPool(database.connectionString, database.schema, 4))
    store = await acquireScoped(
      makePostgresStore({ pool, schema: database.schema, partitions: 64, pipelined: true })
    )
    lock = await heldLock(admin)
    await slowFirstCommitOfH10(admin, database.schema, ["w1"], lock.wait)
  })

  afterAll(async () => {
    await lock?.end()
    await store?.close()
    await pool?.end()
    await database?.drop()
  })

  /** Backends of the store's pool waiting for a lock of `kind` ('advisory': the slow COMMIT). */
  const waitingFor = async (kind: string): Promise<number> =>
    (
      await admin.query(
        "select 1 from pg_stat_activity where application_name = $1 and wait_event_type = 'Lock' and wait_event = $2",
        [applicationName, kind]
      )
    ).rowCount ?? 0

  it("starts no write group while an earlier commit of unknown outcome may still land", async () => {
    const at = Date.now()
    const user = "w1"
    const partition = partitionOf(user, 64)
    // Memory behind the database, as after a load that missed the doubtful commit: the same decision twice.
    const commitOfH10: StoreEvent = {
      kind: "ledger",
      user,
      meter: "analysis",
      periodStart: null,
      operation: "commit",
      holdId: "h10",
      key: "",
      requested: 10,
      delta: 10,
      at
    }
    const append = (position: number) =>
      Effect.runPromiseExit(store.value.write([commitOfH10], { partition, epoch: 0, position, token: "t" }))
    const first = await append(1)
    expect(Exit.isFailure(first), "the first COMMIT gets no answer").toBe(true)
    expect(await waitingFor("advisory"), "and is still running on the server").toBe(1)

    const second = append(2)
    let secondDone = false
    void second.then(() => (secondDone = true))
    // The bug: the second group commits at once while the first still waits, and the first lands after it
    // once the lock is released. Fixed: the first is ended before the second group starts.
    await until(async () => secondDone, "the second append to finish")
    const stillWaiting = await waitingFor("advisory")
    await lock!.release()
    expect((await second)._tag).toBe("Success")
    // Give a first COMMIT that is still there the time to land, as it would after the release.
    await new Promise((resolve) => setTimeout(resolve, 200))
    const rows = await admin.query<{ position: string }>(
      `select position::text from "${database.schema}".partition_log where partition = $1 order by position`,
      [partition]
    )
    expect({ stillWaiting, positions: rows.rows.map((row) => row.position) }).toEqual({
      stillWaiting: 0,
      positions: ["2"]
    })
  }, 20_000)

  it("ends a server process only if its pid, its start and its server's start all match", async () => {
    const doubts = makeOutcomeDoubts(admin, true, () =>
      waitUntilReplicated(admin, database.schema, identifyBackend)
    )
    const live = await pool.connect()
    // Ended below on purpose: its connection's error is expected.
    live.on("error", () => {})
    try {
      const identity = await identifyBackend(live)
      const alive = async () =>
        ((await admin.query("select 1 from pg_stat_activity where pid = $1", [identity.pid])).rowCount ?? 0) >
        0
      // The same pid, started at another moment: a later session that reused the pid. Left alone.
      doubts.add({ ...identity, startedUs: String(BigInt(identity.startedUs) - 1_000_000n) })
      await doubts.settle()
      // The same process as far as pid and start go, but recorded on a server run that has ended.
      doubts.add({ ...identity, serverStartedUs: String(BigInt(identity.serverStartedUs) - 1_000_000n) })
      await doubts.settle()
      expect({ pending: doubts.pending(), alive: await alive() }).toEqual({ pending: false, alive: true })
      expect((await live.query<{ one: number }>("select 1 as one")).rows).toEqual([{ one: 1 }])

      // The process itself: ended, and gone before settle resolves.
      doubts.add(identity)
      await doubts.settle()
      expect({ pending: doubts.pending(), alive: await alive() }).toEqual({ pending: false, alive: false })
      live.release(new Error("ended by the test"))
    } catch (error) {
      live.release(true)
      throw error
    }
  })

  it("waits for the replication barrier after ending a backend, and only then: a read it overlapped reads again", async () => {
    let barriers = 0
    let barrierFails = false
    const doubts = makeOutcomeDoubts(admin, true, async () => {
      barriers += 1
      if (barrierFails) throw new Error("the standby does not answer (test)")
      await waitUntilReplicated(admin, database.schema, identifyBackend)
    })
    /** A session of its own whose process the doubts end. */
    const doomed = async (): Promise<{ identity: BackendIdentity; done: () => void }> => {
      const client = await pool.connect()
      client.on("error", () => {})
      return {
        identity: await identifyBackend(client),
        done: () => client.release(new Error("ended by the test"))
      }
    }

    // No doubt: reads run as they are, no barrier (nothing is paid per load).
    expect(await doubts.readSettled(async () => "read")).toBe("read")
    expect(barriers).toBe(0)

    // A doubt ended: the barrier runs before anything reads.
    const first = await doomed()
    doubts.add(first.identity)
    expect(await doubts.readSettled(async () => "read")).toBe("read")
    first.done()
    expect(barriers).toBe(1)

    // A read during which a settle ended a backend (it may have seen that commit) runs again.
    const second = await doomed()
    let reads = 0
    const read = await doubts.readSettled(async () => {
      reads += 1
      if (reads === 1) {
        doubts.add(second.identity)
        await doubts.settle()
      }
      return reads
    })
    second.done()
    expect({ read, barriers }).toEqual({ read: 2, barriers: 2 })

    // A barrier that fails keeps every read out until one returns; nothing needs ending again.
    const third = await doomed()
    doubts.add(third.identity)
    barrierFails = true
    await expect(doubts.readSettled(async () => "read")).rejects.toThrow("the standby does not answer")
    third.done()
    expect(doubts.pending()).toBe(true)
    barrierFails = false
    expect(await doubts.readSettled(async () => "read")).toBe("read")
    expect({ pending: doubts.pending(), barriers }).toEqual({ pending: false, barriers: 4 })
  })
})
