/**
 * Issue 34, item 2: event ids through a restore, done as an operator would: `pg_dump` of the schema,
 * changes, the coordinator stopped, `pg_restore --clean`, the coordinator started again, other changes.
 * Ids of `<database tag>-<sequence>` alone were handed out again after a restore (the sequence resumed
 * where the dump left it): the publisher took the stream's last id as covering them and removed the
 * new events unpublished. Ids are now `<database tag>-<claim token>-<position>-<index>`, and every claim
 * has a new token. Required: every change acknowledged after the restore has its own event
 * in the stream, no id twice; what the stream holds beyond `used` is exactly what the restore took back.
 *
 * This machine's Postgres (the file's own schema) and NATS with JetStream; pg_dump and pg_restore on PATH.
 */
import { execFile } from "node:child_process"
import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { promisify } from "node:util"
import { jetstreamManager } from "@nats-io/jetstream"
import { connect } from "@nats-io/transport-node"
import type { NatsConnection } from "@nats-io/transport-node"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import type { Command } from "../../src/domain/commands.js"
import { partitionOf } from "../../src/domain/partition.js"
import type { TestSchema } from "../support/database.js"
import { createTestSchema } from "../support/database.js"
import { sleep } from "../support/operations.js"
import { randomPrefix } from "../support/processes.js"
import {
  coordinatorOn,
  everythingPublished,
  publisherOn,
  streamAgainstDatabase,
  streamEvents,
  streamOf
} from "../support/standbyFailover.js"

const execFileAsync = promisify(execFile)
const partitions = 16
const partition = 6
const natsUrl = process.env["NATS_URL"] ?? "nats://127.0.0.1:4222"
const prefix = randomPrefix("restoreids")
let database: TestSchema
let nc: NatsConnection
let dir: string

beforeAll(async () => {
  database = createTestSchema("restore_ids")
  nc = await connect({ servers: natsUrl })
  dir = await mkdtemp(join(tmpdir(), "quota-restore-"))
})

afterAll(async () => {
  await (await jetstreamManager(nc)).streams.delete(streamOf(prefix)).catch(() => false)
  await nc?.close()
  await database?.drop()
  await rm(dir, { recursive: true, force: true })
})

/** `count` users of the partition, named from `label`. */
const users = (label: string, count: number): Array<string> => {
  const found: Array<string> = []
  for (let index = 0; found.length < count; index += 1)
    if (partitionOf(`${label}-${index}`, partitions) === partition) found.push(`${label}-${index}`)
  return found
}

const adjust = (user: string, id: string, amount: number): Command => ({
  op: "adjust",
  user,
  meter: "tokens",
  amount,
  id
})

/** One coordinator's life on the schema: `adjusts` acknowledged and published, then stopped. */
const runCoordinator = async (label: string, amount: number, acknowledged: Set<string>): Promise<void> => {
  const coordinator = await coordinatorOn(database.connectionString, {
    prefix,
    partitions,
    queryTimeoutMs: 5_000,
    schema: database.schema
  })
  const publisher = await publisherOn(nc, coordinator, { prefix, partitions })
  try {
    for (const [index, user] of users(label, 20).entries()) {
      const { status } = await coordinator.submit(adjust(user, `${label}${index}`, amount))
      expect(status).toBe("adjusted")
      acknowledged.add(`${user}/${label}${index}`)
    }
    await everythingPublished(coordinator, database.connectionString, database.schema)
    await sleep(300)
  } finally {
    await publisher.close()
    await coordinator.close()
  }
}

describe("event ids through a pg_dump and pg_restore", () => {
  it("are new after the restore: every later change has its own event in the stream", async () => {
    const dump = join(dir, "schema.dump")
    const kept = new Set<string>()
    await runCoordinator("kept", 1_000, kept)
    await execFileAsync("pg_dump", [
      "-d",
      database.connectionString,
      "-n",
      database.schema,
      "-Fc",
      "-f",
      dump
    ])
    const takenBack = new Set<string>()
    await runCoordinator("taken", 100, takenBack)
    // Restored over the schema with the coordinator stopped, then started again.
    await execFileAsync("pg_restore", ["-d", database.connectionString, "--clean", "--if-exists", dump])
    const afterRestore = new Set<string>()
    await runCoordinator("after", 10, afterRestore)

    const events = await streamEvents(nc, streamOf(prefix))
    const pool = database.pool({ max: 1 })
    const checked = await streamAgainstDatabase(pool, database.schema, events, afterRestore)
    const figures = {
      stream: events.length,
      acknowledgedAfterRestoreWithoutEvent: checked.acknowledgedWithoutEvent,
      idsTwice: checked.idsTwice,
      // The changes between the dump and the restore: published, then taken back by the restore.
      eventsOfChangesTheRestoreTookBack: checked.eventsOfChangesTheDatabaseLacks,
      // Their users' sums are off by exactly those events (each of those users only had one).
      sumMismatches: checked.sumMismatches
    }
    console.log(
      "events through a restore:",
      JSON.stringify(figures),
      "ids:",
      [events[0], events[20], events[40]].map((event) => event?.eventId)
    )
    expect(figures).toEqual({
      stream: 60,
      acknowledgedAfterRestoreWithoutEvent: 0,
      idsTwice: 0,
      eventsOfChangesTheRestoreTookBack: 20,
      sumMismatches: 20
    })
    expect(kept.size + takenBack.size + afterRestore.size).toBe(60)
  }, 120_000)
})
