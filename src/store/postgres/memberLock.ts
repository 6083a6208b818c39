/**
 * This process's advisory lock (migration 0007): held on a connection of its own for as long as the
 * process runs, so that Postgres releases it the moment the process dies and the other members can
 * take its partitions at once. The connection is watched: lost (Postgres restarted, a failover, the
 * network cut), it is made again and the lock taken again.
 *
 * Under the same key: the key is the process's identity in the members table, and a member whose row
 * names a key nobody holds is dead to the others. Taken again under a new key, the process looked dead
 * from that moment until its next heartbeat, and a claimer took the partitions it was claiming back
 * (issue 34, item 3). Only when another session holds the key (the lost session, not yet ended by the
 * server, or another member that drew it meanwhile) is a new one drawn; the old one then still looks
 * alive, and the claims judge a death when they reach a row (ownership.ts), so that stays safe.
 *
 * With the key it records the server the lock was taken on (migration 0010): a lock counts only there.
 */
import { randomInt } from "node:crypto"
import { Effect } from "effect"
import type { Scope } from "effect"
import pg from "pg"
import { storeConnectTimeoutMs } from "../../domain/limits.js"
import { memberLockNamespace } from "./ownership.js"
import { refuseUnlessWritable } from "./writablePrimary.js"

/** The lock while it is held: its key and the server it was taken on (`member_lock_server()`). */
export interface HeldLock {
  readonly key: number
  readonly server: string
}

export interface MemberLock {
  /** The key while the lock is held; null while it is not (connecting, or lost). */
  readonly key: () => number | null
  /** The server the held lock was taken on; null while it is not held. */
  readonly server: () => string | null
}

export interface MemberLockOptions {
  readonly connectionString: string
  /** Where migration 0010's `member_lock_server()` is (serve: `quota`). */
  readonly schema: string
  /**
   * Told when the lock's connection ended: the others may then take this process for dead (its writes
   * are fenced by epoch if they do).
   */
  readonly onLost: (reason: string) => void
  /** Told each time the lock is held (again). */
  readonly onLocked?: () => void
  /** A NOTIFY channel to listen on with the same session, and who hears it (see ownership.ts). */
  readonly notifications?: { readonly channel: string; readonly onNotified: () => void }
}

/** How soon a lost lock connection is made again (after a failover, the claim waits for it). */
const relockDelayMs = 100

/** Takes `key` if no session holds it; returns the server it was taken on, or undefined. */
const tryLock = async (client: pg.Client, schema: string, key: number): Promise<string | undefined> => {
  const row = (
    await client.query<{ locked: boolean; server: string }>(
      `select pg_try_advisory_lock(${memberLockNamespace}, $1) as locked, "${schema}".member_lock_server() as server`,
      [key]
    )
  ).rows[0]
  return row?.locked === true ? row.server : undefined
}

/** Takes the lock for the life of the scope, under the same key each time it is lost and taken again. */
export const holdMemberLock = (options: MemberLockOptions): Effect.Effect<MemberLock, never, Scope.Scope> =>
  Effect.gen(function* () {
    const { connectionString, schema, notifications } = options
    let held: HeldLock | null = null
    /** This process's key since its first lock: tried first each time the lock is taken again. */
    let identity: number | undefined
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
        const kept = identity === undefined ? undefined : await tryLock(next, schema, identity)
        if (kept !== undefined) held = { key: identity!, server: kept }
        // A random key: a collision with a live member's is refused (try) and another key is drawn.
        while (held === null) {
          const candidate = randomInt(1, 2 ** 31 - 1)
          const server = await tryLock(next, schema, candidate)
          if (server !== undefined) {
            identity = candidate
            held = { key: candidate, server }
          }
        }
      } catch (cause) {
        // Ending the session releases whatever it took; the next attempt starts afresh.
        held = null
        await next.end().catch(() => undefined)
        throw cause
      }
      client = next
      options.onLocked?.()
      next.once("end", () => {
        if (client === next) {
          held = null
          client = undefined
          if (!closed) {
            options.onLost("the connection holding this process's member lock ended")
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
          held = null
          await current?.end().catch(() => undefined)
        })
    )
    return { key: () => held?.key ?? null, server: () => held?.server ?? null }
  })
