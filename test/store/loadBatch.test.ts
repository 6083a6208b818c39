/**
 * The load batcher on its own: which loads share a query, what each caller gets, and the bounds. The
 * query here is a function over a Map; the Postgres query it batches is checked in roundtrip.test.ts.
 */
import { describe, expect, it } from "vitest"
import { makeLoadBatch } from "../../src/store/LoadBatch.js"

interface Query {
  readonly keys: ReadonlyArray<string>
  readonly now: number
  readonly answer: (values: ReadonlyMap<string, string>) => void
  readonly fail: (error: Error) => void
}

/** A batcher whose queries wait until the test answers them, so what is in flight is in the test's hands. */
const batcherWithManualQueries = (keysPerQueryMax: number, queriesInFlightMax: number) => {
  const queries: Array<Query> = []
  const batch = makeLoadBatch<string, string>({
    query: (keys, now) =>
      new Promise((resolve, reject) => {
        queries.push({ keys, now, answer: resolve, fail: reject })
      }),
    keysPerQueryMax,
    queriesInFlightMax
  })
  return { batch, queries }
}

const turn = () => new Promise((resolve) => setImmediate(resolve))
const valuesFor = (keys: ReadonlyArray<string>) => new Map(keys.map((key) => [key, `value of ${key}`]))

describe("LoadBatch", () => {
  it("sends a lone load at once, in a query of its own", async () => {
    const { batch, queries } = batcherWithManualQueries(10, 2)
    const loaded = batch.load("a", 100)
    await turn()
    expect(queries.map((query) => query.keys)).toEqual([["a"]])
    queries[0]!.answer(valuesFor(["a"]))
    expect(await loaded).toBe("value of a")
  })

  it("puts loads asked for in the same turn in one query, each distinct key once", async () => {
    const { batch, queries } = batcherWithManualQueries(10, 2)
    const loaded = ["a", "b", "a", "c"].map((key) => batch.load(key, 100))
    await turn()
    expect(queries.map((query) => query.keys)).toEqual([["a", "b", "c"]])
    queries[0]!.answer(valuesFor(["a", "b", "c"]))
    expect(await Promise.all(loaded)).toEqual(["value of a", "value of b", "value of a", "value of c"])
  })

  it("queues loads while queriesInFlightMax queries are out, then sends them together", async () => {
    const { batch, queries } = batcherWithManualQueries(10, 1)
    const first = batch.load("a", 100)
    await turn()
    const later = ["b", "c", "d"].map((key) => batch.load(key, 100))
    await turn()
    expect(queries).toHaveLength(1)
    queries[0]!.answer(valuesFor(["a"]))
    await first
    await turn()
    expect(queries.map((query) => query.keys)).toEqual([["a"], ["b", "c", "d"]])
    queries[1]!.answer(valuesFor(["b", "c", "d"]))
    expect(await Promise.all(later)).toEqual(["value of b", "value of c", "value of d"])
  })

  it("sends at most keysPerQueryMax distinct keys per query, and never more than queriesInFlightMax queries", async () => {
    const { batch, queries } = batcherWithManualQueries(2, 2)
    const loaded = ["a", "b", "c", "d", "e"].map((key) => batch.load(key, 100))
    await turn()
    expect(queries.map((query) => query.keys)).toEqual([
      ["a", "b"],
      ["c", "d"]
    ])
    queries[0]!.answer(valuesFor(["a", "b"]))
    await turn()
    expect(queries.map((query) => query.keys)).toEqual([["a", "b"], ["c", "d"], ["e"]])
    queries[1]!.answer(valuesFor(["c", "d"]))
    queries[2]!.answer(valuesFor(["e"]))
    expect(await Promise.all(loaded)).toEqual(["a", "b", "c", "d", "e"].map((key) => `value of ${key}`))
  })

  it("queries at the earliest `now` of the batch (a later one could forget a closed hold early)", async () => {
    const { batch, queries } = batcherWithManualQueries(10, 1)
    void batch.load("a", 300)
    void batch.load("b", 100)
    void batch.load("c", 200)
    await turn()
    expect(queries[0]!.now).toBe(100)
  })

  it("fails every caller of a failed query, and only them", async () => {
    const { batch, queries } = batcherWithManualQueries(10, 1)
    const failed = [batch.load("a", 100), batch.load("b", 100)]
    await turn()
    const next = batch.load("c", 100)
    queries[0]!.fail(new Error("connection lost"))
    for (const load of failed) await expect(load).rejects.toThrow("connection lost")
    await turn()
    queries[1]!.answer(valuesFor(["c"]))
    expect(await next).toBe("value of c")
  })

  it("fails a caller whose key the query did not answer, and answers the others", async () => {
    const { batch, queries } = batcherWithManualQueries(10, 1)
    const loaded = [batch.load("a", 100), batch.load("b", 100)]
    await turn()
    queries[0]!.answer(valuesFor(["a"]))
    expect(await loaded[0]).toBe("value of a")
    await expect(loaded[1]).rejects.toThrow("no row for b")
  })

  it("fails the batch when the query throws before returning a promise", async () => {
    const batch = makeLoadBatch<string, string>({
      query: () => {
        throw new Error("bad parameters")
      },
      keysPerQueryMax: 10,
      queriesInFlightMax: 1
    })
    await expect(batch.load("a", 100)).rejects.toThrow("bad parameters")
    // The slot it took is given back.
    await expect(batch.load("b", 100)).rejects.toThrow("bad parameters")
  })
})
