/**
 * Group commit: many writers, one transaction. Callers `submit` their items and wait; a writer
 * fiber takes whatever is queued (up to a cap of items), hands it to `commit` as one group, and then
 * completes every waiter of the group with the same outcome. With `writersMax` > 1 several groups
 * commit at once, each taking what queued while the others were in flight. A commit costs a round trip and an
 * fsync whatever its size, so under load the cost is shared by everyone queued behind it.
 *
 * A submission is never split: its items are in exactly one group, so the group's all-or-nothing
 * commit is also all-or-nothing for each submission. A single submission larger than the cap forms
 * a group alone.
 */
import { Deferred, Effect, Exit, Queue } from "effect"
import type { Scope } from "effect"

export interface GroupCommitOptions<A, E> {
  /** Makes one group durable, atomically; items in submission order. */
  readonly commit: (items: ReadonlyArray<A>) => Effect.Effect<void, E>
  /** Items per group; the rest wait for the next commit (see storeEventsPerCommitMax). */
  readonly itemsPerCommitMax: number
  /** What a waiter gets when the writer has stopped before its group was written. */
  readonly closed: () => E
  /**
   * Groups in flight at once (default 1). Only for items whose order across submissions does not
   * matter: the store's callers (actors) have one submission in flight each, so it holds there.
   */
  readonly writersMax?: number
}

export interface GroupCommitStats {
  /** Groups handed to `commit`, failed ones included. */
  readonly commits: number
  readonly failedCommits: number
  readonly submissions: number
  readonly items: number
  readonly largestCommitItems: number
  /** Submissions waiting for the writer right now. */
  readonly queued: number
}

export interface GroupCommit<A, E> {
  /** Succeeds once the group holding `items` committed; fails with the group's error otherwise. */
  readonly submit: (items: ReadonlyArray<A>) => Effect.Effect<void, E>
  readonly stats: Effect.Effect<GroupCommitStats>
}

interface Submission<A, E> {
  readonly items: ReadonlyArray<A>
  readonly done: Deferred.Deferred<void, E>
}

/** The largest prefix of `pending` within `cap` items, at least one submission. */
const takeGroup = <A, E>(pending: Array<Submission<A, E>>, cap: number): Array<Submission<A, E>> => {
  let items = 0
  let count = 0
  while (count < pending.length) {
    const size = pending[count]!.items.length
    if (count > 0 && items + size > cap) break
    items += size
    count += 1
  }
  return pending.splice(0, count)
}

/**
 * Starts the writer in the current scope. Closing the scope lets an in-flight commit finish (its
 * waiters get its outcome) and fails every submission not yet written with `closed()`.
 */
export const makeGroupCommit = <A, E>(
  options: GroupCommitOptions<A, E>
): Effect.Effect<GroupCommit<A, E>, never, Scope.Scope> =>
  Effect.gen(function* () {
    // Unbounded: each actor has at most one write in flight, so the actors bound the queue.
    const queue = yield* Queue.unbounded<Submission<A, E>>()
    // Taken from the queue but not yet in a group (they did not fit under the cap).
    const carried: Array<Submission<A, E>> = []
    const counters = { commits: 0, failedCommits: 0, submissions: 0, items: 0, largestCommitItems: 0 }

    const failUnwritten = Effect.gen(function* () {
      const left = [...carried.splice(0), ...(yield* Queue.clear(queue))]
      yield* Queue.shutdown(queue)
      for (const submission of left) yield* Deferred.fail(submission.done, options.closed())
    })
    // Added before the writer is forked, so it runs after the writer was interrupted.
    yield* Effect.addFinalizer(() => failUnwritten)

    const commitGroup = (group: ReadonlyArray<Submission<A, E>>) =>
      Effect.gen(function* () {
        const items = group.flatMap((submission) => submission.items)
        const exit = yield* Effect.exit(options.commit(items))
        counters.commits += 1
        if (Exit.isFailure(exit)) counters.failedCommits += 1
        counters.largestCommitItems = Math.max(counters.largestCommitItems, items.length)
        for (const submission of group) yield* Deferred.done(submission.done, exit)
      })

    // Takes whatever is queued (waiting only when nothing was carried over), then commits one group.
    // Only the wait is interruptible: once taken, a group is committed and answered even while the
    // scope closes, so no waiter is left without the outcome of a commit that may have happened.
    const writer: Effect.Effect<never> = Effect.forever(
      Effect.uninterruptibleMask((restore) =>
        Effect.gen(function* () {
          const minimum = carried.length > 0 ? 0 : 1
          const taken = yield* restore(Queue.takeBetween(queue, minimum, options.itemsPerCommitMax))
          carried.push(...taken)
          yield* commitGroup(takeGroup(carried, options.itemsPerCommitMax))
        })
      )
    )
    for (let writers = 0; writers < (options.writersMax ?? 1); writers += 1) yield* Effect.forkScoped(writer)

    const submit = (items: ReadonlyArray<A>): Effect.Effect<void, E> =>
      items.length === 0
        ? Effect.void
        : Effect.gen(function* () {
            const done = yield* Deferred.make<void, E>()
            const offered = yield* Queue.offer(queue, { items, done })
            if (!offered) return yield* Effect.fail(options.closed())
            counters.submissions += 1
            counters.items += items.length
            return yield* Deferred.await(done)
          })

    const stats = Effect.map(Queue.size(queue), (queued) => ({ ...counters, queued }))
    return { submit, stats }
  })
