/**
 * Events streams in the tests. Every coordinator a test starts records events and creates its own
 * stream (its prefix is random). JetStream reserves a stream's size cap for as long as the stream
 * exists, and with the 1 GiB default the streams of earlier runs used up the server's storage: new
 * streams were refused ("insufficient storage resources available") and the events tests failed.
 * So test coordinators cap their streams small, and each run first deletes the test streams earlier
 * runs left behind.
 */
import { jetstreamManager } from "@nats-io/jetstream"
import { connect } from "@nats-io/transport-node"
import type { NatsConnection } from "@nats-io/transport-node"
import type pg from "pg"

/** QUOTA_EVENTS_MAX_BYTES for test coordinators: far more than a test publishes. */
export const testEventsMaxBytes = 16 * 1024 * 1024

/** The environment every test `serve` starts with (a test's own settings go over it). */
export const testServeEnv: Readonly<Record<string, string>> = {
  QUOTA_EVENTS_MAX_BYTES: String(testEventsMaxBytes)
}

/** Streams of test prefixes (`randomPrefix`: t, a label, 8 hex digits) and of the bench's coordinators. */
const leftoverPattern = /^(T[A-Z]+[0-9A-F]{8}|BENCH_[0-9A-F]{8}|BSCALE_[0-9A-F]{8})_EVENTS$/

/** Older than this, a matching stream belongs to no run still going (a whole test run takes minutes). */
const leftoverAgeMs = 60 * 60 * 1_000

/** Deletes the leftover streams; says how many. NATS not reachable: nothing to clean, the tests will say. */
export const deleteLeftoverStreams = async (natsUrl: string, now = Date.now()): Promise<number> => {
  const nc = await connect({ servers: natsUrl, name: "test-cleanup" }).catch(() => undefined)
  if (nc === undefined) return 0
  try {
    const manager = await jetstreamManager(nc)
    let deleted = 0
    for await (const stream of manager.streams.list()) {
      const age = now - Date.parse(stream.created)
      if (!leftoverPattern.test(stream.config.name) || !(age > leftoverAgeMs)) continue
      if (await manager.streams.delete(stream.config.name).catch(() => false)) deleted += 1
    }
    return deleted
  } finally {
    await nc.close()
  }
}

/**
 * Events recorded and not yet published (a `serve`'s database, schema `quota`): the events of the
 * partition logs' rows past each partition's published mark.
 */
export const outboxRowCount = async (pool: pg.Pool): Promise<number> =>
  Number(
    (
      await pool.query<{ rows: string }>(
        `select coalesce(sum(log.events), 0)::text as rows from quota.partition_log as log
           left join quota.partition_progress as progress using (partition)
           where log.position > coalesce(progress.published, 0)`
      )
    ).rows[0]?.rows
  )

/** Messages in `stream` now; 0 while it does not exist. */
export const streamMessageCount = async (nc: NatsConnection, stream: string): Promise<number> =>
  (await jetstreamManager(nc)).streams.info(stream).then(
    (info) => info.state.messages,
    () => 0
  )
