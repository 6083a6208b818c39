/**
 * Entries in order of last use, as an intrusive doubly linked list: touching an entry is a few
 * pointer writes, and no table is ever reallocated. The coordinator keeps its resident actors here;
 * it once kept that order by deleting and re-inserting the user in its `Map`, and V8 leaves a deleted
 * entry in its bucket's chain until the table is rehashed, so touching one user over and over (a hot
 * user) made every lookup walk thousands of dead entries: 24 µs a touch with 10 000 actors resident,
 * against 0.3 µs with 100 (Node 20). The request handler keeps its requests in flight here too (see
 * requestHandler.ts for why not a `Set`).
 */

/** The links an entry carries; only the list writes them. */
export interface RecencyLinks<T> {
  /** The entry used next after this one (towards the newest); undefined at the newest or outside. */
  newer: T | undefined
  /** The entry used last before this one (towards the oldest); undefined at the oldest or outside. */
  older: T | undefined
}

export class RecencyList<T extends RecencyLinks<T>> {
  private oldestEntry: T | undefined = undefined
  private newestEntry: T | undefined = undefined
  private count = 0

  get size(): number {
    return this.count
  }

  /** The least recently used entry. */
  get oldest(): T | undefined {
    return this.oldestEntry
  }

  has(entry: T): boolean {
    return entry.newer !== undefined || this.newestEntry === entry
  }

  /** Makes `entry` the most recently used, adding it when it is not in the list. */
  touch(entry: T): void {
    if (this.newestEntry === entry) return
    if (this.has(entry)) this.unlink(entry)
    entry.older = this.newestEntry
    entry.newer = undefined
    if (this.newestEntry === undefined) this.oldestEntry = entry
    else this.newestEntry.newer = entry
    this.newestEntry = entry
    this.count += 1
  }

  /** Takes `entry` out; nothing when it is not in the list. */
  remove(entry: T): void {
    if (this.has(entry)) this.unlink(entry)
  }

  private unlink(entry: T): void {
    if (entry.older === undefined) this.oldestEntry = entry.newer
    else entry.older.newer = entry.newer
    if (entry.newer === undefined) this.newestEntry = entry.older
    else entry.newer.older = entry.older
    entry.newer = undefined
    entry.older = undefined
    this.count -= 1
  }
}
