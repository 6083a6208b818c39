/**
 * Every claim's start of a partition's publisher reads the partition's log afresh. A publisher still
 * running when the partition is claimed (one a step-down did not reach) was kept as it was before: its
 * memory of the log, read when it started, lacked the rows another owner appended meanwhile, and once it
 * had sent what it held it counted everything up to the new owner's last append as published, so the
 * checkpoint moved the mark over those rows and deleted them with their events never sent.
 */
import { Effect, Exit, Scope } from "effect"
import { describe, expect, it } from "vitest"
import type { EventLogShape } from "../../src/events/EventLog.js"
import { makeEventPublisher } from "../../src/events/EventPublisher.js"
import type { QueuedRow } from "../../src/events/EventQueue.js"
import { EventQueue } from "../../src/events/EventQueue.js"
import type { EventSinkShape } from "../../src/events/JetStreamSink.js"
import { noMetrics } from "../../src/ops/MetricsRecorder.js"

const partition = 3
const row = (position: number): QueuedRow => ({
  position,
  token: "other-owner",
  events: [
    { kind: "event", user: "u", event: { event: "limit_changed", at: 1, meter: "tokens", limit: position } }
  ]
})

describe("a publisher started for a claim", () => {
  it("reads the log afresh even when one was still running for the partition", async () => {
    /** The log as another owner left it: rows 1 and 2 unpublished, row 3 added while it ran here. */
    let logRows = [row(1), row(2)]
    const log: EventLogShape = {
      databaseTag: "tag",
      unpublished: (_partition, after, limit) =>
        Effect.sync(() => ({
          published: 0,
          waiting: logRows.length,
          rows: logRows.filter((each) => each.position > (after ?? 0)).slice(0, limit)
        }))
    }
    const sent: Array<string> = []
    const sink: EventSinkShape = {
      ensureStream: Effect.void,
      publishAll: (events) =>
        Effect.sync(() => {
          sent.push(...events.map((each) => each.eventId))
          return events.map(() => "new" as const)
        }),
      lastEvent: () => Effect.succeed(null),
      eventIdsBefore: () => Effect.succeed({ ids: new Set<string>(), complete: true })
    }
    const queue = new EventQueue(100)
    const scope = Scope.makeUnsafe()
    const publisher = await Effect.runPromise(
      Scope.provide(scope)(
        makeEventPublisher({
          log,
          sink,
          queue,
          prefix: "p",
          servable: () => true,
          metrics: noMetrics,
          warn: () => {},
          duplicateWindowMs: 120_000
        })
      )
    )
    queue.listen(publisher.wake)
    const settle = () => new Promise((resolve) => setTimeout(resolve, 50))
    await Effect.runPromise(publisher.start([partition]))
    await settle()
    expect(sent).toEqual(["tag-other-owner-1-1", "tag-other-owner-2-1"])
    // Another owner appended row 3 while this process's publisher kept running (a step-down that did
    // not reach it); then this process claims the partition again and appends row 4 itself.
    logRows = [row(1), row(2), row(3)]
    await Effect.runPromise(publisher.start([partition]))
    queue.appended(partition, { ...row(4), token: "this-owner" })
    await settle()
    expect(sent).toContain("tag-other-owner-3-1")
    // Nothing counts as published past row 3 before it was sent.
    expect(queue.publishedThrough(partition, 4)).toBe(4)
    await Effect.runPromise(Scope.close(scope, Exit.void))
  })
})
