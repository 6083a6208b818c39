/**
 * Runs the real Coordinator (memory store, TestClock) behind a Promise API, so fast-check's async
 * properties can fire commands without awaiting them, move the clock, and simulate a crash.
 */
import { Clock, Context, Deferred, Effect, Exit, Layer, Scope } from "effect"
import { TestClock } from "effect/testing"
import type { CoordinatorOptions, CoordinatorShape } from "../../src/actors/Coordinator.js"
import { Coordinator, coordinatorLayer } from "../../src/actors/Coordinator.js"
import type { Command } from "../../src/domain/commands.js"
import type { Config } from "../../src/domain/config.js"
import { defaultConfig } from "../../src/domain/config.js"
import type { Result } from "../../src/domain/results.js"
import type { StoreShape } from "../../src/store/Store.js"
import { Store } from "../../src/store/Store.js"

/** A reply that may not have arrived yet. `settled` turns true the moment it does. */
export interface Fired {
  readonly command: Command
  readonly promise: Promise<Result>
  readonly settled: () => boolean
  /** The result once settled; undefined before. */
  readonly value: () => Result | undefined
  /**
   * The result if the coordinator answered while enqueueing, before any actor ran: `overloaded` (the
   * mailbox or the resident actors are full: nothing was enqueued) or a system job's slot result.
   */
  readonly atOnce: Result | undefined
}

export interface CoordinatorHarness {
  readonly coordinator: CoordinatorShape
  /** Enqueues now (synchronously, so commands of one user are decided in firing order); does not await. */
  readonly fire: (command: Command) => Fired
  readonly send: (command: Command) => Promise<Result>
  /** TestClock.adjust: wakes every sleep due on the way, each at its own time. */
  readonly advance: (ms: number) => Promise<void>
  readonly now: () => Promise<number>
  /** Interrupts every actor (in-flight commands answer `unavailable`); callers fence the store first. */
  readonly dropAllActors: () => Promise<void>
  readonly sweepOnce: () => Promise<number>
  /** Errors the actors reported (write failures, crashed decisions), for the failure message. */
  readonly errors: Array<string>
  readonly close: () => Promise<void>
}

export interface HarnessOptions {
  readonly config: Config
  readonly store: StoreShape
  /** TestClock time to start at (ms since the epoch). */
  readonly startAt?: number
  readonly actorIdleMs?: number
  /** Caps resident actors: a new user evicts the least recently used idle one, or is `overloaded`. */
  readonly residentActorsMax?: number
  /** Caps resident actors with waiters (apart from the above): past it the oldest one's waits end `busy`. */
  readonly waitingActorsMax?: number
  /**
   * Commands an actor decides per write. Small, more commands queue than one group takes, so one actor
   * run decides and writes several groups in turn (a hot user's path).
   */
  readonly decisionsPerWriteMax?: number
}

export const startCoordinator = async (options: HarnessOptions): Promise<CoordinatorHarness> => {
  const errors: Array<string> = []
  const scope = await Effect.runPromise(Scope.make())
  // The clock first, set to the start time, then the coordinator on it: a coordinator built at time 0
  // would have its periodic fibers step through every tick of the decades up to the start time.
  // warningDelay: the TestClock otherwise logs "not advancing the clock" while fibers sleep.
  const clockContext = await Effect.runPromise(
    Layer.buildWithScope(TestClock.layer({ warningDelay: "1 hour" }), scope)
  )
  if (options.startAt !== undefined)
    await Effect.runPromiseWith(clockContext)(TestClock.setTime(options.startAt))
  const coordinatorContext = await Effect.runPromiseWith(clockContext)(
    Layer.buildWithScope(
      coordinatorLayer({
        config: options.config,
        assertFull: true,
        sweepIntervalMs: 0,
        ...(options.actorIdleMs === undefined ? {} : { actorIdleMs: options.actorIdleMs }),
        ...(options.residentActorsMax === undefined ? {} : { residentActorsMax: options.residentActorsMax }),
        ...(options.waitingActorsMax === undefined ? {} : { waitingActorsMax: options.waitingActorsMax }),
        ...(options.decisionsPerWriteMax === undefined
          ? {}
          : { decisionsPerWriteMax: options.decisionsPerWriteMax }),
        onError: (user, message, cause) => {
          errors.push(`${user}: ${message}: ${String(cause)}`)
        }
      }).pipe(Layer.provide(Layer.succeed(Store, options.store))),
      scope
    )
  )
  const context = Context.merge(clockContext, coordinatorContext)
  const run = Effect.runPromiseWith(context)
  const coordinator = Context.get(context, Coordinator)

  const fire = (command: Command): Fired => {
    const reply = Deferred.makeUnsafe<Result>()
    coordinator.enqueue(command, (result) => Deferred.doneUnsafe(reply, Exit.succeed(result)))
    const atOnce = Deferred.isDoneUnsafe(reply) ? Effect.runSync(Deferred.await(reply)) : undefined
    let value: Result | undefined
    const promise = run(Deferred.await(reply)).then((result) => {
      value = result
      return result
    })
    return { command, promise, settled: () => value !== undefined, value: () => value, atOnce }
  }

  return {
    coordinator,
    fire,
    send: (command) => fire(command).promise,
    advance: (ms) => run(TestClock.adjust(ms)),
    now: () => run(Clock.currentTimeMillis),
    dropAllActors: () => run(coordinator.dropAllActors),
    sweepOnce: () => run(coordinator.sweepOnce),
    errors,
    close: () => Effect.runPromise(Scope.close(scope, Exit.void))
  }
}

/** Lets Effect's fibers (resumed with setImmediate) and promise callbacks run `turns` macrotask turns. */
export const flushTurns = async (turns = 3): Promise<void> => {
  for (let turn = 0; turn < turns; turn += 1) await new Promise<void>((resolve) => setImmediate(resolve))
}

/** Rejects if `promise` has not settled within `ms` of real time: a reply that never comes fails the test, not hangs it. */
export const within = <A>(promise: Promise<A>, ms: number, what: string): Promise<A> => {
  let timer: ReturnType<typeof setTimeout> | undefined
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`no answer within ${ms} ms of real time: ${what}`)), ms)
  })
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer))
}

/**
 * Waits for `promise` for at most `turns` macrotask turns. Without real IO (memory store, TestClock)
 * every reply comes within a few turns, so a reply that has not come by then never will: failing fast
 * keeps shrinking quick. Resolves to whether it settled.
 */
export const settledWithin = async (promise: Promise<unknown>, turns = 500): Promise<boolean> => {
  let done = false
  promise.then(
    () => (done = true),
    () => (done = true)
  )
  for (let turn = 0; turn < turns && !done; turn += 1) await flushTurns(1)
  return done
}

/**
 * Runs `body` against a coordinator over `store` (a memory store) on the test clock, with every
 * aggregate recounted after each decision; `options` adds or overrides coordinator options.
 */
export const runOnCoordinator = <A>(
  store: StoreShape,
  body: Effect.Effect<A, never, Coordinator>,
  options: Partial<CoordinatorOptions> = {}
): Promise<A> =>
  Effect.runPromise(
    Effect.scoped(
      Effect.provide(
        body,
        coordinatorLayer({ config: defaultConfig, assertFull: true, sweepIntervalMs: 0, ...options }).pipe(
          Layer.provide(Layer.succeed(Store, store)),
          Layer.provideMerge(TestClock.layer())
        )
      )
    )
  )
