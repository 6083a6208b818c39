/**
 * Applying one planned fault to the world and healing it after its duration. Each returns when the
 * fault is healed, with a line saying what was done (for the run's log and summary). Faults of the
 * servers every process shares (Postgres, NATS) are in clusterFaults.ts.
 */
import { sleep } from "../cluster/cluster.js"
import { memberLockNamespace } from "../../src/store/postgres/ownership.js"
import type { FaultOutcome } from "./clusterFaults.js"
import { applyClusterFault } from "./clusterFaults.js"
import type { FaultEvent } from "./schedule.js"
import type { NemesisMember, NemesisWorld } from "./world.js"
import { currentServe, isRunning, restartMember, setClockOffset } from "./world.js"

/** How often a lost member lock is looked for again while it must stay lost. */
const lockKillIntervalMs = 50

/** The member's sessions that hold a member lock (advisory, the coordinators' namespace). */
const lockSessions = `from pg_locks as lock join pg_stat_activity as activity on activity.pid = lock.pid
  where lock.locktype = 'advisory' and lock.granted and lock.classid = $1::oid
    and lock.database = (select oid from pg_database where datname = current_database())
    and activity.application_name = $2`

/** Ends the member's member-lock sessions; how many. */
const endLockSessions = async (world: NemesisWorld, member: NemesisMember): Promise<number> => {
  const result = await world.database.pool.query<{ ended: boolean }>(
    `select pg_terminate_backend(lock.pid) as ended ${lockSessions}`,
    [memberLockNamespace, member.app]
  )
  return result.rows.filter((row) => row.ended).length
}

/** The ports the member's member-lock sessions come from (its proxy's side towards Postgres). */
const lockSessionPorts = async (world: NemesisWorld, member: NemesisMember): Promise<Set<number>> => {
  const result = await world.database.pool.query<{ port: number }>(
    `select activity.client_port as port ${lockSessions}`,
    [memberLockNamespace, member.app]
  )
  return new Set(result.rows.map((row) => row.port))
}

/**
 * The ports of the member's ownership-pool connections: the pools share the member's application_name
 * (serve.ts), so they are told apart by what they last ran; only the ownership queries touch
 * `members` and `partition_owners` (the store's fence is `assert_partition_epochs`).
 */
const ownershipPoolPorts = async (world: NemesisWorld, member: NemesisMember): Promise<Set<number>> => {
  const result = await world.database.pool.query<{ port: number }>(
    `select client_port as port from pg_stat_activity
     where application_name = $1 and datname = current_database()
       and (query like '%.members%' or query like '%.partition_owners%')`,
    [member.app]
  )
  return new Set(result.rows.map((row) => row.port))
}

/** Ends the member's member-lock session now and each time it is taken again, for `durationMs`; how many. */
const keepLockLost = async (world: NemesisWorld, member: NemesisMember, durationMs: number) => {
  let ended = await endLockSessions(world, member)
  const until = Date.now() + durationMs
  while (Date.now() < until) {
    await sleep(lockKillIntervalMs)
    ended += await endLockSessions(world, member)
  }
  return ended
}

const setDoubt = async (
  world: NemesisWorld,
  member: NemesisMember,
  probability: number,
  sleepMs: number,
  stallMs?: number
) => {
  await world.database.pool.query(
    `insert into nemesis.doubts (app, probability, sleep_ms, stall_until)
     values ($1, $2, $3, clock_timestamp() + $4 * interval '1 millisecond')
     on conflict (app) do update set probability = excluded.probability, sleep_ms = excluded.sleep_ms,
       stall_until = excluded.stall_until`,
    [member.app, probability, sleepMs, stallMs ?? null]
  )
}

/** How long stepDownPause waits for the process to say it steps down before it pauses it anyway. */
const stepDownSeenMsMax = 2_000

/** Until `serve` logs a line containing `text` after character `from` of its output (or `timeoutMs`). */
const waitForOutput = async (
  serve: ReturnType<typeof currentServe>,
  from: number,
  text: string,
  timeoutMs: number
) => {
  const until = Date.now() + timeoutMs
  while (Date.now() < until) {
    if (serve.output().indexOf(text, from) >= 0) return true
    await sleep(2)
  }
  return false
}

export const applyFault = async (world: NemesisWorld, event: FaultEvent): Promise<FaultOutcome> => {
  switch (event.kind) {
    case "standbyStall":
    case "promote":
    case "postgresRestart":
    case "natsRestart":
      return applyClusterFault(world, event)
    case "memberLockAll": {
      const ended = await Promise.all(
        world.members.map((member) => keepLockLost(world, member, event.durationMs))
      )
      return {
        what: `every member-lock session ended at once (${ended.join(", ")} times) over ${event.durationMs} ms`
      }
    }
    default:
      return { what: await applyMemberFault(world, event) }
  }
}

const applyMemberFault = async (world: NemesisWorld, event: FaultEvent): Promise<string> => {
  const member = world.members[event.member]!
  const name = `m${member.index}`
  switch (event.kind) {
    case "doubt": {
      if (event.stall) {
        await setDoubt(world, member, 1, 0, event.durationMs)
        await sleep(event.durationMs)
        await setDoubt(world, member, 0, 0)
        return `${name}: storage stall, every COMMIT waited until its end, for ${event.durationMs} ms`
      }
      await setDoubt(world, member, event.level, event.sleepMs)
      await sleep(event.durationMs)
      await setDoubt(world, member, 0, 0)
      return `${name}: ${Math.round(event.level * 100)} % of commits slept ${event.sleepMs} ms for ${event.durationMs} ms`
    }
    case "memberLock": {
      const ended = await keepLockLost(world, member, event.durationMs)
      return `${name}: member-lock session ended ${ended} times over ${event.durationMs} ms`
    }
    case "natsReset": {
      await member.nats.cut()
      await sleep(event.durationMs)
      await member.nats.restore()
      return `${name}: NATS connections reset for ${event.durationMs} ms`
    }
    case "natsSilent": {
      member.nats.silence()
      await sleep(event.durationMs)
      member.nats.resume()
      return `${name}: NATS silent for ${event.durationMs} ms`
    }
    case "postgresReset": {
      await member.postgres.cut()
      await sleep(event.durationMs)
      await member.postgres.restore()
      return `${name}: Postgres connections reset for ${event.durationMs} ms`
    }
    case "postgresSilent": {
      // The store's connections go silent; the member-lock session keeps forwarding, or is ended
      // (its new session then waits like any new connection, or passes: a stuck flow, not a partition).
      const spared = await lockSessionPorts(world, member)
      const newConnections = event.newConnectionsPass ? "pass" : "silent"
      member.postgres.silence({ sparedUpstreamPorts: spared, newConnections })
      const ended = event.lockEnded ? await endLockSessions(world, member) : 0
      await sleep(event.durationMs)
      member.postgres.resume()
      return (
        `${name}: Postgres silent on its store connections for ${event.durationMs} ms, member lock ` +
        `${event.lockEnded ? `ended (${ended} sessions)` : `kept (${spared.size} sessions)`}, ` +
        `new connections ${newConnections}`
      )
    }
    case "storeSilent": {
      // Only the store pool goes silent: its requests in flight stay stuck (until the query timeout),
      // holding the step-down, while the ownership pool and the member-lock session pass; new
      // connections pass (the lock's new session, a pool's new connection). While the lock is lost
      // the ownership pool is silent too: a heartbeat without the lock's key would say the process
      // lives, and the others would not take over.
      const [lock, ownership] = await Promise.all([
        lockSessionPorts(world, member),
        ownershipPoolPorts(world, member)
      ])
      const proxy = member.postgres
      proxy.silence({ sparedUpstreamPorts: new Set([...lock, ...ownership]), newConnections: "pass" })
      const lockAfterMs = Math.min(event.lockAfterMs, event.durationMs)
      await sleep(lockAfterMs)
      const lockLostMs = Math.min(event.lockLostMs, event.durationMs - lockAfterMs)
      proxy.silence({ sparedUpstreamPorts: lock, newConnections: "pass" })
      const ended = await keepLockLost(world, member, lockLostMs)
      proxy.resumePorts(ownership)
      await sleep(event.durationMs - lockAfterMs - lockLostMs)
      proxy.resume()
      return (
        `${name}: Postgres silent on its store pool's connections for ${event.durationMs} ms ` +
        `(spared: ${ownership.size} of the ownership pool, ${lock.size} member-lock); member lock ended ` +
        `${ended} times, ownership pool silent too, from +${lockAfterMs} ms for ${lockLostMs} ms, then regained`
      )
    }
    case "pause": {
      const serve = currentServe(member)
      if (!isRunning(serve)) return `${name}: not running, not paused`
      serve.child.kill("SIGSTOP")
      await sleep(event.durationMs)
      serve.child.kill("SIGCONT")
      return `${name}: paused (SIGSTOP) for ${event.durationMs} ms`
    }
    case "kill": {
      const serve = currentServe(member)
      if (!isRunning(serve)) return `${name}: not running, not killed`
      serve.child.kill("SIGKILL")
      await serve.exited
      await sleep(event.durationMs)
      restartMember(member)
      return `${name}: killed (SIGKILL), started again after ${event.durationMs} ms`
    }
    case "clock":
    case "clockBeyond": {
      await setClockOffset(world, member, event.level)
      await sleep(event.durationMs)
      await setClockOffset(world, member, 0)
      const beyond = Math.abs(event.level) > world.clockOffsetMaxMs ? ", beyond the bound" : ""
      return `${name}: wall clock ${event.level > 0 ? "+" : ""}${event.level} ms for ${event.durationMs} ms${beyond}`
    }
    case "stepDownPause": {
      // Stopped as it begins to step down (it logs that before it stops anything): its requests in
      // flight, its subscriptions and its actors stay as they were until long after the others claimed.
      const serve = currentServe(member)
      if (!isRunning(serve)) return `${name}: not running, not paused`
      const from = serve.output().length
      const ended = await endLockSessions(world, member)
      const seen = await waitForOutput(serve, from, "stepping down from all", stepDownSeenMsMax)
      serve.child.kill("SIGSTOP")
      await sleep(event.durationMs)
      serve.child.kill("SIGCONT")
      return (
        `${name}: member lock ended (${ended} sessions), paused (SIGSTOP) ` +
        `${seen ? "as it began to step down" : `${stepDownSeenMsMax} ms after (no step-down seen)`} for ${event.durationMs} ms`
      )
    }
    default:
      throw new Error(`${event.kind} is not a fault of one process`)
  }
}

/** Every fault off: doubts, clocks, proxies forwarding, processes running (one that died is started). */
export const healAll = async (world: NemesisWorld): Promise<void> => {
  await world.database.pool.query("delete from nemesis.doubts")
  for (const member of world.members) {
    await setClockOffset(world, member, 0)
    // Every reset was restored when its fault ended (the run waits for them all before this).
    member.nats.resume()
    member.postgres.resume()
    world.standby?.link.resume()
    const serve = currentServe(member)
    if (isRunning(serve)) serve.child.kill("SIGCONT")
    else restartMember(member)
  }
}
