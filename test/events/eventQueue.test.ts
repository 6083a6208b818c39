/**
 * The publisher's memory of a partition's events (src/events/EventQueue.ts): at most its share of
 * events held, the rest left in the log; nothing counted as published past a row not yet sent, held or
 * not; reads of the log merged with appends once each, in log order.
 */
import { describe, expect, it } from "vitest"
import type { PublishedEvent, QueuedRow } from "../../src/events/EventQueue.js"
import { EventQueue } from "../../src/events/EventQueue.js"

const event = (limit: number): PublishedEvent => ({
  kind: "event",
  user: "u",
  event: { event: "limit_changed", at: 1, meter: "tokens", limit }
})
/** The row at `position` with `count` events. */
const row = (position: number, count = 2): QueuedRow => ({
  position,
  token: "t",
  events: Array.from({ length: count }, (_, index) => event(position * 10 + index))
})
const positions = (queue: EventQueue, partition: number) => queue.rows(partition).map((each) => each.position)

describe("EventQueue", () => {
  it("keeps appends while its share has room, then leaves them to the log and says where to read from", () => {
    const queue = new EventQueue(1_000, 5)
    queue.open(1)
    queue.recovered(1, 0, [], true, 0)
    for (const position of [1, 2, 3, 4]) queue.appended(1, row(position))
    // 2 + 2 held; the third row would make 6 > 5: from position 3 on, the log holds them.
    expect(positions(queue, 1)).toEqual([1, 2])
    expect(queue.behind(1)).toBe(3)
    expect(queue.publishedThrough(1, 4)).toBe(0)
    queue.published(1, 2, 4)
    // Sent what it held: 2 is done, 3 is not.
    expect(queue.publishedThrough(1, 4)).toBe(2)
    expect(queue.idle()).toBe(false)
    expect(queue.refilling(1)).toBe(3)
    // While the log is read, nothing from 3 on counts; an append meanwhile is held.
    queue.appended(1, row(5))
    expect(queue.publishedThrough(1, 5)).toBe(2)
    queue.refilled(1, [row(3), row(4), row(5)], true)
    expect(positions(queue, 1)).toEqual([3, 4, 5])
    expect(queue.behind(1)).toBeUndefined()
    queue.published(1, 3, 6)
    expect(queue.publishedThrough(1, 5)).toBe(5)
    expect(queue.idle()).toBe(true)
  })

  it("a failed append (its outcome maybe a commit) counts as published only once the log is read from it", () => {
    const queue = new EventQueue(1_000, 100)
    queue.open(3)
    queue.recovered(3, 0, [], true, 0)
    queue.appended(3, row(1))
    queue.published(3, 1, 2)
    expect(queue.publishedThrough(3, 1)).toBe(1)
    // Position 2's COMMIT got no answer: settled later, its row may be there with events never queued.
    queue.appendFailed(3, 2)
    queue.appended(3, row(3))
    expect(queue.publishedThrough(3, 3)).toBe(1)
    expect(queue.refilling(3)).toBe(2)
    queue.refilled(3, [row(2), row(3)], true)
    expect(positions(queue, 3)).toEqual([2, 3])
    queue.published(3, 2, 4)
    expect(queue.publishedThrough(3, 3)).toBe(3)

    // Failed while the recovery's read ran (it may have missed the row): read again from it after.
    queue.open(4)
    queue.appendFailed(4, 7)
    queue.recovered(4, 5, [row(6), row(7), row(8)], true, 6)
    expect(positions(queue, 4)).toEqual([6])
    expect(queue.publishedThrough(4, 8)).toBe(5)
    queue.published(4, 1, 2)
    expect(queue.publishedThrough(4, 8)).toBe(6)
    expect(queue.refilling(4)).toBe(7)
  })

  it("a read that stops short leaves what follows it to the next read, dropping appends past it", () => {
    const queue = new EventQueue(1_000, 100)
    queue.open(2)
    queue.appended(2, row(8))
    queue.recovered(2, 3, [row(4), row(5)], false, 10)
    expect(positions(queue, 2)).toEqual([4, 5])
    expect(queue.behind(2)).toBe(6)
    expect(queue.of(2)).toBe(10)
    expect(queue.publishedThrough(2, 8)).toBe(3)
  })

  it("a failed read is made again from the same place", () => {
    const queue = new EventQueue(1_000, 2)
    queue.open(3)
    queue.recovered(3, 0, [row(1)], true, 2)
    queue.appended(3, row(2))
    expect(queue.behind(3)).toBe(2)
    queue.published(3, 1, 2)
    expect(queue.refilling(3)).toBe(2)
    queue.appended(3, row(3))
    queue.refilled(3, undefined, false)
    expect(queue.behind(3)).toBe(2)
    expect(positions(queue, 3)).toEqual([])
    expect(queue.publishedThrough(3, 3)).toBe(1)
  })

  it("while the publisher reads the log at its start, nothing counts beyond the progress row's mark", () => {
    const queue = new EventQueue(1_000)
    queue.open(4)
    queue.appended(4, row(9))
    expect(queue.publishedThrough(4, 9)).toBe(0)
    queue.recovered(4, 7, [row(8)], true, 2)
    expect(positions(queue, 4)).toEqual([8, 9])
    expect(queue.publishedThrough(4, 9)).toBe(7)
  })
})
