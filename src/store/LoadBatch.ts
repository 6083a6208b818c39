/**
 * Batched loads: concurrent `load(key)` calls share queries. A call waits while `queriesInFlightMax`
 * queries are out, then goes with everything that queued meanwhile (up to `keysPerQueryMax` distinct
 * keys), so an idle store answers a lone load at once and a busy one (a partition's cold start, the
 * first touch of thousands of users) pays one round trip per batch instead of one per user. It also
 * keeps loads to a bounded share of the pool's connections, leaving the rest to the writers.
 */

export interface LoadBatchOptions<K, V> {
  /** Loads distinct keys in one query; a key missing from the answer fails its callers. */
  readonly query: (keys: ReadonlyArray<K>, now: number) => Promise<ReadonlyMap<K, V>>
  /** Distinct keys per query (see storeUsersPerLoadMax); the rest wait for the next query. */
  readonly keysPerQueryMax: number
  /** Queries out at once (see storeLoadsInFlightMax); more calls queue. */
  readonly queriesInFlightMax: number
}

interface Waiter<K, V> {
  readonly key: K
  readonly now: number
  readonly resolve: (value: V) => void
  readonly reject: (error: unknown) => void
}

export interface LoadBatch<K, V> {
  /** The key's value as of `now` (a batch queries at the earliest `now` of its callers). */
  readonly load: (key: K, now: number) => Promise<V>
}

export const makeLoadBatch = <K, V>(options: LoadBatchOptions<K, V>): LoadBatch<K, V> => {
  const waiting: Array<Waiter<K, V>> = []
  let inFlight = 0

  /** Takes waiters until keysPerQueryMax distinct keys; a key already taken brings its other callers. */
  const takeBatch = (): Array<Waiter<K, V>> => {
    const keys = new Set<K>()
    let count = 0
    while (count < waiting.length) {
      const key = waiting[count]!.key
      if (!keys.has(key) && keys.size === options.keysPerQueryMax) break
      keys.add(key)
      count += 1
    }
    return waiting.splice(0, count)
  }

  const send = (batch: ReadonlyArray<Waiter<K, V>>): void => {
    inFlight += 1
    // The earliest `now`: a later one could drop a closed hold from the retention window early.
    let now = Infinity
    for (const waiter of batch) now = Math.min(now, waiter.now)
    const keys = [...new Set(batch.map((waiter) => waiter.key))]
    let answered: Promise<ReadonlyMap<K, V>>
    try {
      answered = options.query(keys, now)
    } catch (error) {
      answered = Promise.reject(error)
    }
    answered
      .then(
        (values) => {
          for (const waiter of batch) {
            if (values.has(waiter.key)) waiter.resolve(values.get(waiter.key) as V)
            else waiter.reject(new Error(`the load query returned no row for ${String(waiter.key)}`))
          }
        },
        (error: unknown) => {
          for (const waiter of batch) waiter.reject(error)
        }
      )
      .finally(() => {
        inFlight -= 1
        pump()
      })
  }

  const pump = (): void => {
    while (inFlight < options.queriesInFlightMax && waiting.length > 0) send(takeBatch())
  }

  const load = (key: K, now: number): Promise<V> =>
    new Promise<V>((resolve, reject) => {
      waiting.push({ key, now, resolve, reject })
      // Deferred to a microtask so loads asked for in the same turn (one scheduler run of many
      // actors' fibers) go in the same query.
      if (waiting.length === 1) queueMicrotask(pump)
    })

  return { load }
}
