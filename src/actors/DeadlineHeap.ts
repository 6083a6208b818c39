/**
 * A min-heap of (deadline, key) with at most one entry per key: the coordinator's one timer for every
 * actor's next expiry, instead of a timer per actor. `set` moves a key's entry and `delete` removes it
 * (positions are kept in a Map), so the heap holds one entry per actor that has something due, not one
 * per decision that ever scheduled something: an entry left behind for each reserve grew the heap by
 * millions of objects over an hour of load (a hold's default TTL), all of it old-generation garbage.
 */
export interface DeadlineEntry<K> {
  readonly at: number
  readonly key: K
}

export class DeadlineHeap<K> {
  private readonly entries: Array<DeadlineEntry<K>> = []
  private readonly positions = new Map<K, number>()

  get size(): number {
    return this.entries.length
  }

  /** The key's deadline, if it has one. */
  get(key: K): number | undefined {
    const position = this.positions.get(key)
    return position === undefined ? undefined : this.entries[position]!.at
  }

  /** Sets the key's deadline, replacing the one it had. */
  set(key: K, at: number): void {
    const position = this.positions.get(key)
    if (position === undefined) {
      this.entries.push({ at, key })
      this.positions.set(key, this.entries.length - 1)
      this.siftUp(this.entries.length - 1)
      return
    }
    const before = this.entries[position]!.at
    this.entries[position] = { at, key }
    if (at < before) this.siftUp(position)
    else this.siftDown(position)
  }

  /** Removes the key's deadline; false when it had none. */
  delete(key: K): boolean {
    const position = this.positions.get(key)
    if (position === undefined) return false
    this.removeAt(position)
    return true
  }

  peek(): DeadlineEntry<K> | undefined {
    return this.entries[0]
  }

  pop(): DeadlineEntry<K> | undefined {
    const top = this.entries[0]
    if (top !== undefined) this.removeAt(0)
    return top
  }

  /** For tests: no entry is earlier than its parent, and every key's position points at its entry. */
  isValid(): boolean {
    const entries = this.entries
    if (this.positions.size !== entries.length) return false
    return entries.every(
      (entry, index) =>
        this.positions.get(entry.key) === index && (index === 0 || entries[(index - 1) >> 1]!.at <= entry.at)
    )
  }

  private removeAt(position: number): void {
    const entries = this.entries
    const removed = entries[position]!
    const last = entries.pop()!
    this.positions.delete(removed.key)
    if (position === entries.length) return
    entries[position] = last
    this.positions.set(last.key, position)
    if (last.at < removed.at) this.siftUp(position)
    else this.siftDown(position)
  }

  private swap(left: number, right: number): void {
    const entries = this.entries
    const leftEntry = entries[left]!
    const rightEntry = entries[right]!
    entries[left] = rightEntry
    entries[right] = leftEntry
    this.positions.set(rightEntry.key, left)
    this.positions.set(leftEntry.key, right)
  }

  private siftUp(start: number): void {
    const entries = this.entries
    let index = start
    while (index > 0) {
      const parent = (index - 1) >> 1
      if (entries[parent]!.at <= entries[index]!.at) return
      this.swap(parent, index)
      index = parent
    }
  }

  private siftDown(start: number): void {
    const entries = this.entries
    let index = start
    for (;;) {
      const left = 2 * index + 1
      const right = left + 1
      let smallest = index
      if (left < entries.length && entries[left]!.at < entries[smallest]!.at) smallest = left
      if (right < entries.length && entries[right]!.at < entries[smallest]!.at) smallest = right
      if (smallest === index) return
      this.swap(smallest, index)
      index = smallest
    }
  }
}
