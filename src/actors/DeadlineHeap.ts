/**
 * A min-heap of (deadline, key): the coordinator's one timer for every actor's next expiry, instead of
 * a timer per actor. Entries are never removed early; a popped entry the owner no longer wants (its
 * deadline moved) is skipped by the caller.
 */
export interface DeadlineEntry<K> {
  readonly at: number
  readonly key: K
}

export class DeadlineHeap<K> {
  private readonly entries: Array<DeadlineEntry<K>> = []

  get size(): number {
    return this.entries.length
  }

  push(at: number, key: K): void {
    const entries = this.entries
    entries.push({ at, key })
    let index = entries.length - 1
    while (index > 0) {
      const parent = (index - 1) >> 1
      if (entries[parent]!.at <= entries[index]!.at) break
      ;[entries[parent], entries[index]] = [entries[index]!, entries[parent]!]
      index = parent
    }
  }

  peek(): DeadlineEntry<K> | undefined {
    return this.entries[0]
  }

  pop(): DeadlineEntry<K> | undefined {
    const entries = this.entries
    const top = entries[0]
    const last = entries.pop()
    if (top === undefined || last === undefined || entries.length === 0) return top
    entries[0] = last
    let index = 0
    for (;;) {
      const left = 2 * index + 1
      const right = left + 1
      let smallest = index
      if (left < entries.length && entries[left]!.at < entries[smallest]!.at) smallest = left
      if (right < entries.length && entries[right]!.at < entries[smallest]!.at) smallest = right
      if (smallest === index) return top
      ;[entries[smallest], entries[index]] = [entries[index]!, entries[smallest]!]
      index = smallest
    }
  }
}
