/**
 * Group commit: many writers, one transaction. Callers `submit` their items and wait; when a writer
 * slot is free, whatever is queued (up to a cap of items) goes to `commit` as one group, and every
 * waiter of the group is completed with the same outcome. With `writersMax` > 1 several groups commit
 * at once, each taking what queued while the others were in flight. A commit costs a round trip and an
 * fsync whatever its size, so under load the cost is shared by everyone queued behind it.
 *
 * A group starts in a microtask after the submission that found a writer free: everything submitted in
 * the same synchronous run (the actors of one NATS message, the messages of one socket read) shares it.
 * No fiber waits for work and no scheduler turn is spent between a submission and its commit.
 *
 * A submission is never split: its items are in exactly one group, so the group's all-or-nothing
 * commit is also all-or-nothing for each submission. A single submission larger than the cap forms
 * a group alone. A group that failed because of one submission (`isolate`) is committed again one
 * submission at a time: one user's conflicting row must not fail every other user's write.
 */
import { Cause, Effect, Exit, Fiber, Option } from "effect"
import type { Scope } from "effect"

export interface GroupCommitOptions<A, E> {
  /** Makes one group durable, atomically; items in submission order. */
  readonly commit: (items: ReadonlyArray<A>) => Effect.Effect<void, E>
  /** Items per group, as `sizeOf` counts them; the rest wait for the next commit (see storeEventsPerCommitMax). */
  readonly itemsPerCommitMax: number
  /** What one item counts for against itemsPerCommitMax and in the stats (default 1). */
  readonly sizeOf?: (item: A) => number
  /** What a waiter gets when the writer has stopped before its group was written. */
  readonly closed: () => E
  /**
   * Groups in flight at once (default 1). Only for items whose order across submissions does not
   * matter: the store's callers (actors) have one submission in flight each, so it holds there.
   */
  readonly writersMax?: number
  /**
   * Whether a group's failure came from one of its submissions and says nothing of the others (a row
   * that conflicts, a partition fenced): the group's submissions are then committed again one by one,
   * so that only the submission at fault fails. Never for a failure whose outcome is unknown.
   */
  readonly isolate?: (error: E) => boolean
}

export interface GroupCommitStats {
  /** Groups handed to `commit`, failed ones included. */
  readonly commits: number
  readonly failedCommits: number
  readonly submissions: number
  readonly items: number
  readonly largestCommitItems: number
  /** Submissions waiting for a writer right now. */
  readonly queued: number
}

export interface GroupCommit<A, E> {
  /** Succeeds once the group holding `items` committed; fails with the group's error otherwise. */
  readonly submit: (items: ReadonlyArray<A>) => Effect.Effect<void, E>
  readonly stats: Effect.Effect<GroupCommitStats>
}

interface Submission<A, E> {
  readonly items: ReadonlyArray<A>
  /** Its items' sizes summed (see sizeOf). */
  readonly size: number
  readonly done: (exit: Exit.Exit<void, E>) => void
}

/** The largest prefix of `pending` within `cap` items, at least one submission. */
const takeGroup = <A, E>(pending: Array<Submission<A, E>>, cap: number): Array<Submission<A, E>> => {
  let items = 0
  let count = 0
  while (count < pending.length) {
    const size = pending[count]!.size
    if (count > 0 && items + size > cap) break
    items += size
    count += 1
  }
  return pending.splice(0, count)
}

/**
 * Makes the group commit in the current scope. Closing the scope fails every submission not yet in a
 * group with `closed()` and waits for the groups in flight: their waiters get their outcome, never
 * silence about a commit that may have happened.
 */
export const makeGroupCommit = <A, E>(
  options: GroupCommitOptions<A, E>
): Effect.Effect<GroupCommit<A, E>, never, Scope.Scope> =>
  Effect.gen(function* () {
    const runFork = Effect.runForkWith(yield* Effect.context<never>())
    const writersMax = options.writersMax ?? 1
    const pending: Array<Submission<A, E>> = []
    /**
     * Commits in flight; not interrupted at shutdown (see above), only awaited. An array, not a Set: a
     * Set's table is reallocated as entries come and go, and a replaced table left in the old
     * generation keeps what it pointed at alive through young collections (see requestHandler.ts).
     */
    const committing: Array<Fiber.Fiber<void>> = []
    let startScheduled = false
    let open = true
    const counters = { commits: 0, failedCommits: 0, submissions: 0, items: 0, largestCommitItems: 0 }

    /** Commits `items` once; the exit as the waiters get it (an interruption or defect included). */
    const commitOnce = (items: ReadonlyArray<A>): Effect.Effect<Exit.Exit<void, E>> =>
      Effect.map(Effect.exit(options.commit(items)), (outcome) => {
        counters.commits += 1
        if (Exit.isFailure(outcome)) counters.failedCommits += 1
        return outcome
      })

    /** Whether the group failed because of one of its submissions (see `isolate`). */
    const isolates = (outcome: Exit.Exit<void, E>, group: ReadonlyArray<Submission<A, E>>): boolean => {
      if (group.length < 2 || options.isolate === undefined || Exit.isSuccess(outcome)) return false
      const error = Cause.findErrorOption(outcome.cause)
      return Option.isSome(error) && options.isolate(error.value)
    }

    const commitGroup = (group: ReadonlyArray<Submission<A, E>>): Effect.Effect<void> =>
      Effect.suspend(() => {
        const items = group.length === 1 ? group[0]!.items : group.flatMap((submission) => submission.items)
        let size = 0
        for (const submission of group) size += submission.size
        counters.largestCommitItems = Math.max(counters.largestCommitItems, size)
        let answered = 0
        const answerAll = (outcome: Exit.Exit<void, E>) =>
          Effect.sync(() => {
            for (; answered < group.length; answered += 1) group[answered]!.done(outcome)
          })
        return Effect.flatMap(commitOnce(items), (outcome) =>
          isolates(outcome, group)
            ? Effect.forEach(group, (submission) =>
                Effect.flatMap(commitOnce(submission.items), (alone) =>
                  Effect.sync(() => {
                    submission.done(alone)
                    answered += 1
                  })
                )
              )
            : answerAll(outcome)
        ).pipe(
          // An interruption (shutdown waits, but a defect may still end the fiber) answers the rest.
          Effect.onExit((exit) =>
            Exit.isSuccess(exit) ? Effect.void : answerAll(Exit.failCause(exit.cause))
          ),
          Effect.asVoid
        )
      })

    /** Starts groups while writers are free; each finished commit looks again. */
    const startGroups = (): void => {
      startScheduled = false
      while (open && pending.length > 0 && committing.length < writersMax) {
        const fiber = runFork(commitGroup(takeGroup(pending, options.itemsPerCommitMax)))
        committing.push(fiber)
        fiber.addObserver(() => {
          const index = committing.indexOf(fiber)
          if (index >= 0) committing.splice(index, 1)
          startGroups()
        })
      }
    }

    const sizeOf = options.sizeOf
    const sizeOfAll = (items: ReadonlyArray<A>): number => {
      if (sizeOf === undefined) return items.length
      let size = 0
      for (const item of items) size += sizeOf(item)
      return size
    }

    const submit = (items: ReadonlyArray<A>): Effect.Effect<void, E> =>
      items.length === 0
        ? Effect.void
        : Effect.callback<void, E>((resume) => {
            if (!open) return resume(Effect.fail(options.closed()))
            const size = sizeOfAll(items)
            counters.submissions += 1
            counters.items += size
            const submission: Submission<A, E> = { items, size, done: resume }
            pending.push(submission)
            if (!startScheduled && committing.length < writersMax) {
              startScheduled = true
              queueMicrotask(startGroups)
            }
            // The waiter was interrupted (its actor dropped with its partition): a submission still
            // waiting for a writer is withdrawn, so it cannot land after the user's next actor loaded.
            // One already in a group is committed or fails with it (the fence decides which).
            return Effect.sync(() => {
              const index = pending.indexOf(submission)
              if (index >= 0) pending.splice(index, 1)
            })
          })

    yield* Effect.addFinalizer(() =>
      Effect.gen(function* () {
        open = false
        for (const submission of pending.splice(0)) submission.done(Exit.fail(options.closed()))
        yield* Fiber.awaitAll([...committing])
      })
    )

    const stats = Effect.sync(() => ({ ...counters, queued: pending.length }))
    return { submit, stats }
  })
