/**
 * Requests being decided, counted per partition, so that stopping a partition (hand-over, shutdown)
 * can wait until every request it took has been answered.
 */
export class InFlight {
  private readonly counts = new Map<number, number>()
  private readonly waiters = new Set<{
    readonly partitions: ReadonlyArray<number>
    readonly wake: () => void
  }>()

  begin(partition: number): void {
    this.counts.set(partition, (this.counts.get(partition) ?? 0) + 1)
  }

  end(partition: number): void {
    const count = (this.counts.get(partition) ?? 0) - 1
    if (count > 0) {
      this.counts.set(partition, count)
      return
    }
    this.counts.delete(partition)
    for (const waiter of this.waiters) if (this.idleIn(waiter.partitions)) waiter.wake()
  }

  total(): number {
    let sum = 0
    for (const count of this.counts.values()) sum += count
    return sum
  }

  isIdle(): boolean {
    return this.counts.size === 0
  }

  private idleIn(partitions: ReadonlyArray<number>): boolean {
    return partitions.every((partition) => !this.counts.has(partition))
  }

  /** Resolves once none of `partitions` has a request in flight, or after `timeoutMs`; true if idle. */
  idle(partitions: ReadonlyArray<number>, timeoutMs: number): Promise<boolean> {
    if (this.idleIn(partitions)) return Promise.resolve(true)
    return new Promise((resolve) => {
      const waiter = {
        partitions,
        wake: () => {
          clearTimeout(timer)
          this.waiters.delete(waiter)
          resolve(true)
        }
      }
      const timer = setTimeout(() => {
        this.waiters.delete(waiter)
        resolve(false)
      }, timeoutMs)
      this.waiters.add(waiter)
    })
  }
}
