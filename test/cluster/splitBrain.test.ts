/**
 * Split brain (scaling out): one of three `serve` processes is frozen with SIGSTOP past its lease while
 * the load goes on; the others must take its partitions over (new epochs) and keep granting from the
 * same users' capacity. Then it is resumed with SIGCONT, its actors' memory now stale and its NATS
 * subscriptions still open, so part of the load reaches it. The epoch fence must turn every write it
 * attempts into `unavailable` (clients retry elsewhere): zero over-grants, zero lost grants, no wrong
 * answer from its stale memory, and it steps down from what was taken.
 *
 * Two moments of the freeze: between two of its writes, and inside a write transaction, after its fence
 * statement locked its owner rows (FOR KEY SHARE) and before COMMIT (see freezeAt).
 *
 * Witnesses make the stale-memory case certain rather than left to chance: users of its partitions made
 * resident in its memory before the freeze, given a hold by the new owner while it is frozen, and whose
 * commits are sent so that some wait in its socket and are decided by it when it resumes.
 */
import { readFileSync, readdirSync, readlinkSync } from "node:fs"
import { connect } from "@nats-io/transport-node"
import type { NatsConnection } from "@nats-io/transport-node"
import { afterAll, describe, expect, it } from "vitest"
import { partitionOf } from "../../src/domain/partition.js"
import { checkDatabase } from "../support/databaseChecks.js"
import type { TestDatabase } from "../support/processes.js"
import { createTestDatabase, randomPrefix, stopServe } from "../support/processes.js"
import { requestUntilDecided } from "../support/wire.js"
import { sample, scrape } from "../support/operations.js"
import type { HoldingProxy } from "./holdingProxy.js"
import { startHoldingProxy } from "./holdingProxy.js"
import type { Member, OwnerRow } from "./cluster.js"
import {
  Load,
  clientOverGrants,
  databaseAgainstClients,
  describeFailures,
  logEntries,
  outputs,
  meter,
  ownerRows,
  probePartitions,
  sleep,
  startCluster,
  userOnPartition,
  withoutDecisions
} from "./cluster.js"

/** Local ports of a process's TCP connections to Postgres (port 5432), from /proc. */
const postgresClientPorts = (pid: number): Array<number> => {
  const inodes = new Set<string>()
  for (const fd of readdirSync(`/proc/${pid}/fd`)) {
    try {
      const link = readlinkSync(`/proc/${pid}/fd/${fd}`)
      if (link.startsWith("socket:[")) inodes.add(link.slice(8, -1))
    } catch {
      // closed meanwhile
    }
  }
  const ports: Array<number> = []
  for (const table of ["/proc/net/tcp", "/proc/net/tcp6"]) {
    for (const line of readFileSync(table, "utf8").split("\n").slice(1)) {
      const fields = line.trim().split(/\s+/)
      const [local, remote, inode] = [fields[1], fields[2], fields[9]]
      if (local === undefined || remote === undefined || inode === undefined || !inodes.has(inode)) continue
      if (parseInt(remote.split(":")[1] ?? "", 16) === 5432)
        ports.push(parseInt(local.split(":")[1] ?? "", 16))
    }
  }
  return ports
}

interface Session {
  readonly state: string
  readonly query: string
  /** Locks it holds on quota.partition_owners (a write's FOR KEY SHARE shows as RowShareLock). */
  readonly ownerRowLocks: string | null
}

/** Postgres sessions whose client is at one of `ports` (the frozen process's, or its proxy's). */
const sessionsOf = async (database: TestDatabase, ports: ReadonlyArray<number>): Promise<Array<Session>> => {
  const result = await database.pool.query<Session>(
    `select activity.state, left(regexp_replace(activity.query, '\\s+', ' ', 'g'), 70) as query,
            (select string_agg(lock.mode, ',') from pg_locks lock
              where lock.pid = activity.pid and lock.relation = 'quota.partition_owners'::regclass)
              as "ownerRowLocks"
     from pg_stat_activity activity
     where activity.datname = current_database() and activity.client_port = any($1::integer[])`,
    [ports]
  )
  return result.rows
}

/** Sessions of this database waiting for a lock: what a frozen transaction holds back. */
const lockWaits = async (database: TestDatabase): Promise<Array<string>> => {
  const result = await database.pool.query<{ query: string; waiting: string }>(
    `select left(regexp_replace(query, '\\s+', ' ', 'g'), 70) as query,
            (extract(epoch from clock_timestamp() - query_start) * 1000)::bigint::text as waiting
     from pg_stat_activity where datname = current_database() and wait_event_type = 'Lock'`
  )
  return result.rows.map((row) => `waiting ${row.waiting} ms: ${row.query}`)
}

type Moment = "between two writes" | "inside a write transaction"

const describeSessions = (sessions: ReadonlyArray<Session>): string =>
  JSON.stringify(sessions.filter((session) => session.state !== "idle"))

/**
 * Freezes the process (SIGSTOP) at the wanted moment.
 *
 * Between two writes: none of its sessions inside a transaction or running a statement; a freeze at
 * another moment is undone at once and tried again, which under load takes a few attempts.
 *
 * Inside a write transaction: its database connections go through a HoldingProxy, which lets a write
 * through up to its fence statement (FOR KEY SHARE taken on the owner rows) and holds the rest; the process
 * is frozen right then. A pipelined write leaves the process in one go, so a SIGSTOP alone almost never
 * catches it there; a freeze or a network cut between its packets does.
 */
const freezeAt = async (
  database: TestDatabase,
  member: Member,
  moment: Moment,
  proxy: HoldingProxy | undefined
): Promise<{ stoppedAt: number; sessions: Array<Session>; attempts: number }> => {
  const pid = member.serve.child.pid!
  if (moment === "inside a write transaction") {
    await Promise.race([
      proxy!.holdNextFencedWrite(),
      sleep(10_000).then(() => {
        throw new Error(`no write of ${member.owner} reached its fence within 10 s`)
      })
    ])
    const stoppedAt = Date.now()
    member.serve.child.kill("SIGSTOP")
    await sleep(150)
    return { stoppedAt, sessions: await sessionsOf(database, proxy!.upstreamPorts()), attempts: 1 }
  }
  for (let attempts = 1; attempts <= 60; attempts += 1) {
    const stoppedAt = Date.now()
    member.serve.child.kill("SIGSTOP")
    await sleep(150)
    const sessions = await sessionsOf(database, postgresClientPorts(pid))
    if (sessions.every((session) => session.state === "idle")) return { stoppedAt, sessions, attempts }
    member.serve.child.kill("SIGCONT")
    await sleep(50 + ((attempts * 37) % 150))
  }
  throw new Error(`could not freeze ${member.owner} ${moment} in 60 attempts`)
}

const partitions = 16
const leaseMs = 1_500
/** "Taken over within the lease plus a few seconds." */
const takeoverBoundMs = leaseMs + 4_000
const servers = "127.0.0.1:4222"

const scenario = async (moment: Moment, seed: number, cleanup: Array<() => Promise<void>>) => {
  const database = await createTestDatabase("splitbrain")
  const prefix = randomPrefix("sb")
  const members: Array<Member> = []
  // The process to freeze reaches Postgres through a proxy that can hold its write mid-transaction.
  const proxy =
    moment === "inside a write transaction" ? await startHoldingProxy("127.0.0.1", 5432) : undefined
  cleanup.push(async () => {
    for (const member of members) {
      member.serve.child.kill("SIGCONT")
      await stopServe(member.serve, "SIGKILL")
    }
    await proxy?.close()
    await database.drop()
  })
  const env = {
    DATABASE_URL: database.url,
    QUOTA_PREFIX: prefix,
    QUOTA_PARTITIONS: String(partitions),
    QUOTA_LEASE_MS: String(leaseMs),
    // Debug shows every answer, `not_found` and `exists` included: what a superseded process said.
    LOG_LEVEL: "debug"
  }
  const throughProxy = new URL(database.url)
  if (proxy !== undefined) throughProxy.port = String(proxy.port)
  members.push(
    ...(await startCluster(env, database.pool, partitions, 3, (index): Record<string, string> =>
      index === 0 && proxy !== undefined ? { DATABASE_URL: throughProxy.toString() } : {}
    ))
  )
  const load = await Load.start({
    servers,
    prefix,
    partitions,
    label: "sb",
    workers: 32,
    usersPerPartition: 3,
    limit: 12,
    amountMax: 3,
    seed,
    client: { timeoutMs: 1_000, retry: { attemptsMax: 60, baseDelayMs: 25, delayMsMax: 250 } }
  })
  const loadStarted = Date.now()
  await sleep(3_000)

  const frozen = members[0]!
  const held = (await ownerRows(database.pool)).filter((row) => row.owner === frozen.owner)
  expect(held.length).toBeGreaterThan(0)
  const logFrom = frozen.serve.output().length
  const nc = await natsConnection()
  const witnesses = await prepareWitnesses(
    nc,
    prefix,
    held.map((row) => row.partition),
    load
  )

  const freeze = await freezeAt(database, frozen, moment, proxy)
  const { stoppedAt } = freeze

  // Wait until every partition it held carries another owner under a newer epoch.
  let taken: Array<OwnerRow> = []
  let takenAfterMs: number | undefined
  let stalled = ""
  for (;;) {
    const rows = await ownerRows(database.pool)
    taken = held.flatMap((old) => {
      const row = rows.find((candidate) => candidate.partition === old.partition)
      return row !== undefined && row.owner !== frozen.owner && row.epoch > old.epoch ? [row] : []
    })
    if (taken.length === held.length) {
      takenAfterMs = Date.now() - stoppedAt
      break
    }
    if (Date.now() - stoppedAt > takeoverBoundMs) {
      stalled =
        `while frozen ${moment}, ${taken.length} of its ${held.length} partitions were taken over in ` +
        `${Date.now() - stoppedAt} ms.\nIts sessions at the freeze: ${describeSessions(freeze.sessions)}\n` +
        `Lock waits now: ${JSON.stringify(await lockWaits(database))}\nOwners now: ${JSON.stringify(rows)}\n` +
        `Partitions answering now: ${[...(await probeWith(prefix))].join(", ")}`
      break
    }
    await sleep(100)
  }

  // The others serve and grant from those users' capacity while its memory goes stale.
  const clean = takenAfterMs === undefined ? [] : await reserveBehindItsBack(nc, prefix, witnesses)
  if (takenAfterMs !== undefined) await sleep(2_000)
  const grantsBeforeResume = load.acknowledged.holds.size
  // Commits of the witnesses' holds, sent while it is still frozen: about half of them wait in its
  // socket and are decided by it when it resumes, from memory that never saw those holds.
  const witnessCommits = clean.flatMap((witness) =>
    Array.from({ length: 4 }, () => commitOnce(nc, prefix, witness))
  )
  await sleep(100)
  frozen.serve.child.kill("SIGCONT")
  proxy?.release()
  const resumedAt = Date.now()
  const witnessAnswers = await Promise.all(witnessCommits)
  const wrongWitnessAnswers = witnessAnswers.filter(
    (answer) => !["committed", "exists", "unavailable", "no answer"].includes(answer.status)
  )

  // Load keeps going: some of it reaches the resumed process through its still open subscriptions.
  await sleep(5_000)
  const unsettledWitnesses = await settleWitnesses(load, witnesses)
  const report = await load.stop()

  const afterLog = logEntries(frozen.serve, logFrom)
  const stepDowns = afterLog.filter((entry) => entry.msg === "stepped down from partitions")
  const steppedDownFrom = new Set(stepDowns.flatMap((entry) => entry["partitions"] as Array<number>))
  const fencedWrites = afterLog.filter(
    (entry) => entry.msg === "write failed" && /PartitionsFenced|superseded/.test(JSON.stringify(entry))
  ).length
  // The same refusals as its metric counts them (per group commit).
  const frozenPort = frozen.serve.httpPort()
  const fencedMetric =
    frozenPort === undefined ? undefined : sample(await scrape(frozenPort), "quota_fenced_writes_total")
  const takenPartitions = new Set(taken.map((row) => row.partition))
  const stepDownTime = (partition: number): number =>
    stepDowns.find((entry) => (entry["partitions"] as Array<number>).includes(partition))?.time ?? Infinity
  // What it answered (other than `unavailable`) after the resume and before it stepped down, for users of
  // partitions already taken from it: answers from a superseded process (debug level shows them all).
  const staleAnswers = new Map<string, number>()
  for (const entry of afterLog) {
    const user = entry["user"]
    if (typeof entry["op"] !== "string" || typeof user !== "string" || entry.time < resumedAt) continue
    const partition = partitionOf(user, partitions)
    if (!takenPartitions.has(partition) || entry.time > stepDownTime(partition)) continue
    if (entry["status"] === "unavailable") continue
    const key = `${entry["op"]} ${String(entry["status"])}`
    staleAnswers.set(key, (staleAnswers.get(key) ?? 0) + 1)
  }
  const rows = await ownerRows(database.pool)
  // It owns none of what was taken under the epoch it was taken with: a row that names it again is
  // a fresh claim (a newer epoch), made after it stepped down, when rebalancing gave it back.
  const stillOwned = taken.flatMap((takenRow) => {
    const now = rows.find((row) => row.partition === takenRow.partition)!
    return now.owner === frozen.owner && now.epoch <= takenRow.epoch ? [now] : []
  })
  const reclaimedBeforeStepDown = taken.flatMap((takenRow) => {
    const stepDownAt = stepDownTime(takenRow.partition)
    const claim = afterLog.find(
      (entry) =>
        entry.msg === "claimed partitions" &&
        (entry["partitions"] as Array<number>).includes(takenRow.partition)
    )
    return claim !== undefined && claim.time < stepDownAt ? [takenRow.partition] : []
  })

  const database_ = await checkDatabase(database.pool, load.snapshot())
  const overGrants = clientOverGrants(load)
  const mismatches = await databaseAgainstClients(database.pool, load)
  const summary =
    `split brain, frozen ${moment} (attempt ${freeze.attempts}; its sessions: ${describeSessions(freeze.sessions)}): ` +
    `${frozen.owner} held partitions ${held.map((row) => row.partition).join(", ")}; ` +
    (takenAfterMs === undefined
      ? `NOT taken over within ${takeoverBoundMs} ms (${taken.length} of ${held.length} were); `
      : `taken over ${takenAfterMs} ms after the SIGSTOP (lease ${leaseMs} ms); `) +
    `resumed after ${resumedAt - stoppedAt} ms; its fenced writes after resume: ${fencedWrites} ` +
    `(quota_fenced_writes_total ${String(fencedMetric)}); ` +
    `its answers between the resume and its step-down for partitions taken from it, besides unavailable ` +
    `(grants among them were written before the freeze): ${JSON.stringify(Object.fromEntries(staleAnswers))}; ` +
    `first step-down ${Math.min(...stepDowns.map((entry) => entry.time)) - resumedAt} ms after the resume; ` +
    `step-downs: ${stepDowns.map((entry) => `${JSON.stringify(entry["partitions"])} (${String(entry["reason"])})`).join("; ")}. ` +
    `Load: ${report.cycles} cycles, ${report.granted} grants (${report.granted - grantsBeforeResume} after the resume), ` +
    `${report.refused} refusals (limit hit), ${report.users} users, ${report.retries} retries, ` +
    `${report.failures.length} failed calls, longest call ${report.longestCallMs} ms; ` +
    `witness holds granted by the new owners behind its back: ${clean.length}, commits of them answered by ` +
    `status: ${JSON.stringify(countBy(witnessAnswers.map((answer) => answer.status)))}; ` +
    `${database_.checked} acknowledgements checked; violations: ${overGrants.length} over-grants seen by clients, ` +
    `${database_.violations.length} from checkDatabase, ${mismatches.length} Postgres vs clients`
  console.log(summary)

  // Safety first, whatever happened to liveness.
  expect(overGrants, summary).toEqual([])
  expect(database_.violations, summary).toEqual([])
  expect(takenAfterMs, `${summary}\n${stalled}\n${outputs(members.slice(1))}`).toBeDefined()
  expect(clean.length, summary).toBeGreaterThan(0)
  // A commit of a pending hold is `committed` (or `exists`); `unavailable` from a process that lost the
  // partition is fine (the client retries); `not_found` from its stale memory is a wrong answer.
  expect(wrongWitnessAnswers, summary).toEqual([])
  expect(unsettledWitnesses, summary).toEqual([])
  expect(report.failures, `${summary}\n${describeFailures(report.failures, loadStarted)}`).toEqual([])
  expect(mismatches, summary).toEqual([])
  expect(
    taken.filter((row) => !steppedDownFrom.has(row.partition)).map((row) => row.partition),
    `partitions taken over that the resumed process never logged stepping down from:\n${withoutDecisions(frozen.serve.output())}`
  ).toEqual([])
  expect(stillOwned).toEqual([])
  // A write the fence refused moved the metric (it counts group commits, a log line is an actor's write,
  // and a group whose actors were all dropped meanwhile logs nothing: so only this direction is exact).
  expect(fencedMetric, summary).toBeDefined()
  if (fencedWrites > 0) expect(fencedMetric, summary).toBeGreaterThan(0)
  expect(reclaimedBeforeStepDown).toEqual([])
  expect(report.granted).toBeGreaterThan(200)
  expect(report.refused).toBeGreaterThan(50)

  for (const member of members) expect(await stopServe(member.serve), outputs([member])).toBe(0)
  members.length = 0
}

let probeConnection: NatsConnection | undefined
const natsConnection = async (): Promise<NatsConnection> => (probeConnection ??= await connect({ servers }))
const probeWith = async (prefix: string): Promise<Set<number>> =>
  probePartitions(await natsConnection(), prefix, partitions, 300)

const countBy = (values: ReadonlyArray<string>): Record<string, number> => {
  const counts: Record<string, number> = {}
  for (const value of values) counts[value] = (counts[value] ?? 0) + 1
  return counts
}

interface Witness {
  readonly user: string
  readonly id: string
}

const witnessLimit = 12

/**
 * Witness users on the partitions of the process about to freeze, made resident in its memory (their
 * `set_limit` is decided by it) before the freeze, and then left alone by the load.
 */
const prepareWitnesses = async (
  nc: NatsConnection,
  prefix: string,
  heldPartitions: ReadonlyArray<number>,
  load: Load
): Promise<Array<Witness>> => {
  const witnesses = heldPartitions.flatMap((partition) =>
    Array.from({ length: 4 }, (_, index) => ({
      user: userOnPartition("witness", partition, index, partitions),
      id: "witness-hold"
    }))
  )
  await Promise.all(
    witnesses.map(async ({ user }) => {
      const { result } = await requestUntilDecided(
        { nc, prefix, partitions },
        { op: "set_limit", user, meter, limit: witnessLimit },
        { kind: "admin" }
      )
      expect(result.status).toBe("ok")
      load.limits.set(user, witnessLimit)
    })
  )
  return witnesses
}

/**
 * While it is frozen and its partitions are taken over: one reserve per witness, sent once. An answer
 * means a new owner granted it (the frozen process never saw it); no answer means it went to the frozen
 * process's still open subscription, and that witness is not used.
 */
const reserveBehindItsBack = async (
  nc: NatsConnection,
  prefix: string,
  witnesses: ReadonlyArray<Witness>
): Promise<Array<Witness>> => {
  const clean: Array<Witness> = []
  await Promise.all(
    witnesses.map(async (witness) => {
      try {
        const reply = await nc.request(
          `${prefix}.v1.${partitionOf(witness.user, partitions)}.ops`,
          JSON.stringify({ op: "reserve", user: witness.user, meter, amount: 1, id: witness.id }),
          { timeout: 500 }
        )
        if (reply.json<{ status: string }>().status === "reserved") clean.push(witness)
      } catch {
        // decided later by the frozen process, or not at all
      }
    })
  )
  return clean
}

/** One commit request, no retry, its answer's status ("no answer" on a timeout). */
const commitOnce = async (
  nc: NatsConnection,
  prefix: string,
  witness: Witness
): Promise<{ user: string; status: string }> => {
  try {
    const reply = await nc.request(
      `${prefix}.v1.${partitionOf(witness.user, partitions)}.ops`,
      JSON.stringify({ op: "commit", user: witness.user, id: witness.id, amount: 1 }),
      { timeout: 8_000 }
    )
    return { user: witness.user, status: reply.json<{ status: string }>().status }
  } catch {
    return { user: witness.user, status: "no answer" }
  }
}

/**
 * Brings every witness to a known end through the SDK (reserve with the same id, then commit), so the
 * checks against Postgres see each witness hold acknowledged and committed. Returns what went wrong.
 */
const settleWitnesses = async (load: Load, witnesses: ReadonlyArray<Witness>): Promise<Array<string>> => {
  const problems: Array<string> = []
  await Promise.all(
    witnesses.map(async ({ user, id }) => {
      const reserved = await load.client.reserve({ user, meter, amount: 1, id })
      // `closed`: already committed by one of the witness commits above.
      if (reserved.status !== "reserved" && reserved.status !== "exists" && reserved.status !== "closed") {
        problems.push(`${user}: reserve answered ${reserved.status}`)
        return
      }
      load.acknowledged.holds.set(`${user}/${id}`, { user, id, amount: 1 })
      const committed = await load.client.commit({ user, id, amount: 1 })
      if (committed.status !== "committed" && committed.status !== "exists") {
        problems.push(`${user}: commit answered ${committed.status}`)
        return
      }
      load.acknowledged.commits.set(`${user}/${id}`, { user, id, amount: 1 })
    })
  )
  return problems
}

describe("cluster: a process frozen past its lease, then resumed under load", () => {
  const cleanup: Array<() => Promise<void>> = []

  afterAll(async () => {
    for (const step of cleanup) await step()
    await probeConnection?.close()
  })

  it("frozen between two writes: taken over, grants nothing twice, loses nothing, steps down", async () => {
    await scenario("between two writes", 2, cleanup)
  }, 120_000)

  it("frozen inside a write transaction: the same, though it holds a lock on its owner rows", async () => {
    await scenario("inside a write transaction", 3, cleanup)
  }, 120_000)
})
