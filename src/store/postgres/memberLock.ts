/**
 * This process's advisory lock (migration 0007): held on a connection of its own for as long as the
 * process runs, so that Postgres releases it the moment the process dies and the other members can
 * take its partitions at once. The connection is watched: lost (Postgres restarted, the network cut),
 * it is made again and the lock taken again, under a new key if another session holds the old one.
 */
import { randomInt } from "node:crypto"
import { Effect } from "effect"
import type { Scope } from "effect"
import pg from "pg"
import { storeConnectTimeoutMs } from "../../domain/limits.js"
import { memberLockNamespace } from "./ownership.js"
import { refuseUnlessWritable } from "./writablePrimary.js"

export interface MemberLock {
  /** The key while the lock is held; null while it is not (connecting, or lost). */
  readonly key: () => number | null
}

/** How soon a lost lock connection is made again. */
const relockDelayMs = 250

/**
 * Takes the lock for the life of the scope. `onLost` is told when the lock's connection ended (the
 * others may then take this process for dead: its writes are fenced by epoch if they do), `onLocked`
 * each time the lock is held (again).
 */
export const holdMemberLock = (
  connectionString: string,
  onLost: (reason: string) => void,
  onLocked: () => void = () => {},
  /** A NOTIFY channel to listen on with the same session, and who hears it (see ownership.ts). */
  notifications?: { readonly channel: string; readonly onNotified: () => void }
): Effect.Effect<MemberLock, never, Scope.Scope> =>
  Effect.gen(function* () {
    let key: number | null = null
    let client: pg.Client | undefined
    let closed = false
    let timer: ReturnType<typeof setTimeout> | undefined

    const lockOnce = async (): Promise<void> => {
      const next = new pg.Client({ connectionString, connectionTimeoutMillis: storeConnectTimeoutMs })
      next.on("error", () => {})
      try {
        await next.connect()
        // The lock of a member that writes nowhere would say it is alive: only on a writable primary.
        await refuseUnlessWritable(next)
        if (notifications !== undefined) {
          next.on("notification", () => notifications.onNotified())
          await next.query(`listen "${notifications.channel}"`)
        }
        // A random key: a collision with a live member's is refused (try) and another key is drawn.
        for (;;) {
          const candidate = randomInt(1, 2 ** 31 - 1)
          const result = await next.query<{ locked: boolean }>(
            `select pg_try_advisory_lock(${memberLockNamespace}, $1) as locked`,
            [candidate]
          )
          if (result.rows[0]?.locked === true) {
            key = candidate
            break
          }
        }
      } catch (cause) {
        // Ending the session releases whatever it took; the next attempt starts afresh.
        await next.end().catch(() => undefined)
        throw cause
      }
      client = next
      onLocked()
      next.once("end", () => {
        if (client === next) {
          key = null
          client = undefined
          if (!closed) {
            onLost("the connection holding this process's member lock ended")
            schedule()
          }
        }
      })
    }

    const schedule = (): void => {
      timer = setTimeout(() => {
        lockOnce().catch(() => {
          if (!closed) schedule()
        })
      }, relockDelayMs)
    }

    yield* Effect.acquireRelease(
      Effect.promise(() =>
        lockOnce().catch(() => {
          // Postgres not reachable yet: keep trying in the background; the lease still works.
          schedule()
        })
      ),
      () =>
        Effect.promise(async () => {
          closed = true
          if (timer !== undefined) clearTimeout(timer)
          const current = client
          client = undefined
          key = null
          await current?.end().catch(() => undefined)
        })
    )
    return { key: () => key }
  })
