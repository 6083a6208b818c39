/**
 * Every limit of the coordinator, with its unit last and what happens when it is reached.
 * Protocol bounds (PROTOCOL.md "Bounds") come first; operational limits after.
 */

/** Largest amount, limit or usage (2^53-1). A command that would take `used` or `reserved` past it is `invalid_request`. */
export const amountMax = Number.MAX_SAFE_INTEGER

/** Bytes of a user, id, job, key or ref. Longer is `invalid_request`. */
export const identifierBytesMax = 256

/** Hold time to live for `reserve` and `extend`. Outside is `invalid_request`. */
export const holdTtlMsMin = 1_000
export const holdTtlMsMax = 86_400_000
export const holdTtlMsDefault = 3_600_000

/** Slot lease for `acquire_slot` and `renew_slot`. Outside is `invalid_request`. */
export const slotLeaseMsMin = 1_000
export const slotLeaseMsMax = 3_600_000
export const slotLeaseMsDefault = 120_000

/** How long `acquire_slot` may wait in the user's FIFO queue. Outside is `invalid_request`. */
export const slotWaitMsMax = 300_000

/** `thresholds` one meter may list (PROTOCOL.md). More refuse the configuration file. */
export const thresholdsPerMeterMax = 4

/** Holds one `list_holds` returns (`limit`). Outside 1..max is `invalid_request`; past it `more` is true. */
export const holdListLimitMax = 1_000
export const holdListLimitDefault = 100

/** Periods one `usage_history` covers (`periods`, revision 1.3). Outside 1..max is `invalid_request`. */
export const usageHistoryPeriodsMax = 36
export const usageHistoryPeriodsDefault = 12

/** Users one `list_usage` page lists (`limit`, revision 1.3). Outside 1..max is `invalid_request`; past it `more` is true. */
export const usageListLimitMax = 1_000
export const usageListLimitDefault = 1_000

/**
 * Past periods of every meter the store keeps at least (PROTOCOL.md revision 1.3): QUOTA_USAGE_PERIODS_KEPT
 * may keep more, never fewer. Older usage rows and ledger rows are deleted by the retention sweep.
 */
export const usagePeriodsKeptMin = 36
/** QUOTA_USAGE_PERIODS_KEPT's ceiling (100 years of months). */
export const usagePeriodsKeptMax = 1_200

/** Commands in one batch message. A longer array gets the NATS service error 400. */
export const batchCommandsMax = 1_000

/** Bytes of one request body. A larger one gets the NATS service error 400. */
export const messageBytesMax = 1_048_576

/** How long a closed hold's id, its consume keys and an `adjust` id are remembered (the retry window). */
export const idRetentionMs = 7 * 86_400_000

/**
 * How long an actor decides without giving the event loop back. A group is cut short when it passes
 * this (its undecided commands go back to the front of the mailbox), and an actor whose groups write
 * nothing (reads) yields between groups once it has run this long: a batch of heavy reads (a thousand
 * `list_holds` of a user with a thousand holds took 650 ms in one piece) cannot stall everyone else.
 */
export const actorTurnMsMax = 10

/**
 * A hold's consume keys are those applied since it was created, less this: a consume decided while the
 * clock read a little earlier than the hold's `createdAt` (the clock stepped back, or another process's
 * clock lags) is still this incarnation's. An id is reused only after its retention ended, so the
 * keys of an earlier incarnation are days older than this. Two serving processes' clocks differ by at
 * most twice clockOffsetMaxMsMax (2 minutes), far within this: no key is lost on reload.
 */
export const consumeKeyClockSlackMs = 86_400_000

/**
 * Pending holds one user may have at once. A `reserve` of a new id past it answers `limit_reached`
 * (bound `pending_holds`): a user with ten thousand pieces of work in flight is a runaway client, and
 * each pending hold is scanned on expiry. Committing or releasing a hold makes room.
 */
export const pendingHoldsPerUserMax = 10_000

/**
 * Closed holds and `adjust` ids an actor keeps in memory per user, each. Past it the oldest is
 * forgotten from memory before its retention ends; the store still remembers it for the whole window
 * (PROTOCOL.md: at least 7 days), and a command naming an id memory no longer holds is decided only
 * after the store was asked for it (`recall`). The cap bounds an actor's memory, not the contract.
 */
export const closedHoldsPerUserMax = 100_000
export const adjustIdsPerUserMax = 100_000

/**
 * Closed holds and `adjust` ids a load reads per user, each, newest first. A user with more within the
 * retention window is loaded with the newest only (its older ids recalled on demand): the load of a
 * user who made millions of ids in a week stays bounded in rows and time, and so does every other
 * user's load that shares its statement.
 */
export const loadRememberedIdsPerUserMax = 10_000

/** Ids one recall asks the store for (a group's commands naming ids memory does not hold). */
export const recallIdsMax = 1_000

/** Distinct consume keys per hold. A `consume` with a new key past it answers `limit_reached` (bound `consume_keys`). */
export const consumeKeysPerHoldMax = 10_000

/**
 * `acquire_slot` requests waiting per user, one per job (a repeat of a waiting job replaces its earlier
 * request). A new job that would wait past it answers `limit_reached` (bound `slot_waiters`).
 */
export const slotWaitersPerUserMax = 1_000

/** Commands queued in one user's mailbox. A full mailbox answers `overloaded`. */
export const mailboxCapacity = 4_096

/** Commands one actor decides before handing their events to the store in one write. */
export const actorDecisionsPerWriteMax = 512

/**
 * After an actor's write failed, what falls due in its state (an expiry, a lease end) is decided again
 * no sooner than this: a store that refuses (events outbox full) is not asked again in a tight loop.
 */
export const failedWriteRetryDelayMs = 1_000

/**
 * Actors resident at once, those resting with waiters apart (see waitingActorsMax). A new user past it
 * evicts the least recently used idle actor; if every one it counts is running (loading, deciding,
 * writing), `overloaded` until one is done.
 */
export const residentActorsMax = 100_000

/** An actor with nothing queued, no waiters and no write in flight is evicted after this idle time. */
export const actorIdleMs = 60_000

/**
 * A partition actor checkpoints (brings its log's appends into the tables, off the request path) once
 * this many appends wait for it, or checkpointIntervalMs after the oldest of them, whichever is first.
 * The tail a new owner brings in after a crash is bounded by them.
 */
export const checkpointLogRowsMax = 64
export const checkpointIntervalMs = 1_000

/**
 * Appends of a partition that may wait for a checkpoint (the store failing them). Past it, a batch that
 * would append more is answered `unavailable` until a checkpoint catches up: the tail stays bounded.
 */
export const unprojectedLogRowsMax = 4_096

/**
 * Checkpoint transactions (a partition's open among them) a process runs at once; the rest wait their
 * turn, so a cold start that opens every partition leaves the pool's other connections to loads and
 * appends.
 */
export const checkpointsInFlightMax = 4

/**
 * Log rows one checkpoint transaction reads back and projects (a new owner bringing a long tail in);
 * the rest go in the next transactions.
 */
export const checkpointRowsPerTransactionMax = 256

/** Store events written in one commit by the group-commit writer; the rest wait for the next commit. */
export const storeEventsPerCommitMax = 8_192

/**
 * How often the orphan sweep looks for due holds and leases of users with no resident actor (resident
 * actors have timers of their own). PROTOCOL.md lets an expiry be up to a minute late; every second
 * was a database transaction a second of an idle process for nothing.
 */
export const sweepIntervalMs = 5_000

/** Users one sweep run sends an expiry tick to; the rest wait for the next run. */
export const sweepUsersPerRunMax = 1_000

/** Partitions (`QUOTA_PARTITIONS`). A larger value refuses to start: each partition costs two subscriptions. */
export const partitionsMax = 1_024

/**
 * How long stopping the NATS transport waits for requests in flight to be answered. Past it the rest
 * are answered `unavailable` (nothing granted by that reply; a retry with the same id says what stands).
 */
export const transportDrainMs = 30_000

/**
 * How long stopping a partition's subscription waits for the NATS server to confirm its drain. Past it
 * (or at once while disconnected) the subscription is dropped locally: stepping down must not wait for
 * a server that cannot be reached.
 */
export const subscriptionDrainWaitMs = 1_000

/**
 * How long serving a partition waits for the NATS server to confirm its subscriptions (a flush). Past
 * it the serve fails: the claim is stepped down from and released, and claimed again by a later round.
 */
export const subscribeFlushWaitMs = 2_000

/**
 * How long the Postgres store waits for a connection from its pool. Past it the load or commit fails
 * with `StoreUnavailable`: its callers answer `unavailable` instead of hanging on a dead server.
 */
export const storeConnectTimeoutMs = 5_000

/**
 * How long the Postgres store waits for one statement's answer (client side). Past it the statement
 * fails, its transaction is rolled back or its connection dropped, and the callers (every waiter of a
 * commit) get `StoreUnavailable`.
 */
export const storeQueryTimeoutMs = 10_000

/**
 * The range `QUOTA_STORE_QUERY_TIMEOUT` may set storeQueryTimeoutMs to. Below the minimum an ordinary
 * write under load would time out and its outcome be doubtful; past the maximum a dead server holds
 * every caller that long. A value outside is refused at start with the variable's name.
 */
export const storeQueryTimeoutMsMin = 100
export const storeQueryTimeoutMsMax = 300_000

/**
 * A group whose COMMIT's answer never came (the query timeout, a lost connection) may still commit on
 * the server. Before any later load or write group, the store ends that transaction's backend and waits
 * for it to be gone, so what follows sees its final outcome. Past this wait (the backend still there, or
 * the server unreachable) those loads and writes fail with `StoreUnavailable` and the next one tries again.
 */
export const storeOutcomeSettleWaitMs = 2_000

/**
 * A read of the store (a load, a recall, the events outbox) during which a settle ended the backend of a
 * doubtful commit may have seen that commit before the synchronous standby had it: it is run again after
 * the settle's replication barrier, up to this many times in all. Past it (doubts ended during every
 * attempt) the read fails with `StoreUnavailable` (callers answer `unavailable`; the publisher retries).
 */
export const storeSettledReadAttemptsMax = 3

/** Partitions when QUOTA_PARTITIONS is unset (PROTOCOL.md). */
export const partitionsDefault = 64

/**
 * Client (src/client): how long one request message waits for its reply before the attempt counts as
 * a timeout and is retried (same ids). An `acquire_slot` that waits in the queue gets its `waitMs` on top.
 */
export const clientRequestTimeoutMs = 5_000

/**
 * Client: attempts per command, the first included, for `unavailable`, `overloaded`, no responders and
 * timeouts. Past it the call fails with `QuotaRetriesExhausted`.
 */
export const clientRetryAttemptsMax = 5

/** Client: backoff before the first retry; it doubles per attempt, with jitter, up to the maximum below. */
export const clientRetryBaseDelayMs = 50

/** Client: the longest backoff between two attempts of one command. Doubling stops here. */
export const clientRetryDelayMsMax = 2_000

/**
 * Client discovery (`connect({ discover: true })`): how long `$SRV.INFO.quota-coordinator` replies are
 * collected at most. Past it the client goes on with the replies it has; with none it fails to connect.
 */
export const clientDiscoveryWaitMs = 2_000

/** Client discovery: collecting stops this long after the latest reply (every coordinator answers at once). */
export const clientDiscoveryStallMs = 150

/**
 * A partition owner's lease (`QUOTA_LEASE_MS`). A process that does not renew within it (killed,
 * paused, cut off) loses its partitions to the others; its writes are fenced by epoch, not by this time.
 * Renewed every third of it. Outside the bounds the coordinator refuses to start.
 */
export const partitionLeaseMsDefault = 6_000
export const partitionLeaseMsMin = 1_000
export const partitionLeaseMsMax = 600_000

/**
 * How often each process looks for members known dead (their advisory lock released with their
 * connection: killed, crashed) that still hold leases; finding one starts an ownership round at once,
 * so their partitions are served again within about this, not after their leases. One statement each
 * time: at 200 ms it was half of an idle process's database transactions.
 */
export const memberDeathCheckIntervalMs = 500

/**
 * How long a process may be cut off from NATS before it gives up every partition it owns (steps down,
 * releases the leases, heartbeats as leaving) so that the others serve them: a reconnect within it
 * (a NATS server restarting, a client moving to another server of a cluster) costs no hand-off.
 */
export const natsLossGraceMs = 1_000

/**
 * The NATS client's pings: every quarter of the lease (at least this often, never more often than
 * natsPingIntervalMsMin), and a connection with natsPingsOutstandingMax unanswered is taken for dead and
 * reconnected. A silent connection (a network partition that resets nothing) is then seen in about
 * three quarters of a lease, not in nats.js's default of minutes.
 */
export const natsPingIntervalMsMin = 500
export const natsPingsOutstandingMax = 2

/**
 * The most a process's wall clock may differ from Postgres's (`QUOTA_CLOCK_OFFSET_MAX_MS`), as
 * CockroachDB's maximum clock offset. Each process measures its offset every ownership round; while it
 * is beyond this (with the measurement's uncertainty), the process answers for no partition and gives
 * them all up to the others, and says why (log, /readyz, metrics). So two serving processes' clocks
 * differ by at most twice this, and the time-based decisions wait that long past a deadline before
 * they act on it (src/domain/config.ts clockSkewMaxMs). Outside the bounds the coordinator refuses to
 * start; the upper bound keeps twice it far below consumeKeyClockSlackMs.
 */
export const clockOffsetMaxMsDefault = 500
export const clockOffsetMaxMsMin = 10
export const clockOffsetMaxMsMax = 60_000

/**
 * Readings of Postgres's clock per measurement of the offset: each costs a round trip, the one with
 * the shortest is kept (its uncertainty, half the round trip, is the smallest). A measurement whose
 * best uncertainty is over half the maximum offset is not trusted: the previous one stands.
 */
export const clockSamplesPerMeasurementMax = 3

/**
 * How long one attempt to reach a NATS server may take, from the TCP connect to the server's answer
 * to the first PING (nats.js's `timeout`, 20 s by default). Past it the attempt is given up and the
 * next begins natsReconnectWaitMs after the last began. An attempt begun during a silent cut (the
 * network lost its packets, the server's greeting among them) is given up within this, not waited out
 * for up to 20 s after the network healed. A server slower than this to greet (TLS over a long,
 * loaded path) is never reached: raise it then. At start, `serve` tries again until natsStartWaitMs.
 */
export const natsConnectAttemptTimeoutMs = 1_500
/**
 * How long `serve` keeps trying to reach NATS at start while the network refuses or stays silent (a
 * process restarted during an outage, or started before NATS): each failed attempt is logged (warn),
 * an attempt begins every natsReconnectWaitMs, and `/readyz` says NATS is not connected yet. A refused
 * authentication, expired credentials or a failed TLS handshake end the start at once. Past this,
 * `serve` exits 1 with the last reason, for its supervisor to start it again.
 */
export const natsStartWaitMs = 60_000

/**
 * At start, `serve` tries its database again every storeStartRetryMs while no server answers at the
 * address (refused, reset, unresolvable, starting up), for up to storeStartWaitMs, logging each attempt;
 * then it exits 1 with the reason. A server that answers with an error ends the start at once.
 */
export const storeStartWaitMs = 60_000
export const storeStartRetryMs = 1_000
/**
 * Between the starts of two attempts to reach the same server (nats.js's reconnectTimeWait, 2 s by
 * default; plus its jitter of up to 100 ms): a healed network or a restarted server is reached within
 * about max(this, natsConnectAttemptTimeoutMs).
 */
export const natsReconnectWaitMs = 1_000

/**
 * How often each process checks its store as a load uses it: the commits of unknown outcome settled,
 * then a round trip on the store's pool (src/cluster/ServingAbility.ts). One statement each time, one
 * check at a time; a check is waited for the serving-loss grace at most.
 */
export const storeCheckIntervalMs = 500

/**
 * How long a process bears its store failing every check, or a step-down that does not end (its
 * requests in flight wait on something stuck), before it stops counting on itself: this share of the
 * lease, at least servingLossGraceMsMin. Past it, a failed store makes it give every partition up (as a
 * NATS loss does) until a check passes, and a stuck step-down makes it heartbeat as leaving and release
 * the leases it no longer serves until the step-down ends: the others claim them, so every partition is
 * served again within a lease and a round of a single fault.
 */
export const servingLossGraceShareOfLease = 1 / 3
export const servingLossGraceMsMin = 1_000

/** Connections of the pool that heartbeats and renews partition leases, apart from the store's. */
export const ownershipPoolConnections = 2

/** Idle actors are looked for every quarter of actorIdleMs, but not more often than this. */
export const idleEvictionIntervalMsMin = 250

/**
 * Write groups committed at once, each on its own connection. Safe because an actor has at most one
 * write in flight, so concurrent groups never hold two dependent writes of one user; more writers
 * overlap round trips and fsyncs. Past it, groups wait for a writer (and grow).
 */
export const storeWritersMax = 4

/**
 * Users loaded by one query. Loads asked for while others are out wait and go together; past this
 * many distinct users, the rest wait for the next query.
 */
export const storeUsersPerLoadMax = 256

/** Load queries out at once; more loads queue (and batch). Keeps the pool's other connections for writes. */
export const storeLoadsInFlightMax = 2

/**
 * How often `serve` checks that Postgres answers, for `GET /readyz`, and how long one check may take.
 * A check that fails or takes longer marks Postgres down until one succeeds: readiness follows an
 * outage within about interval + timeout.
 */
export const readinessCheckIntervalMs = 1_000

/**
 * How often `serve` reads the primary's synchronous standbys (pg_stat_replication) for the log and
 * quota_postgres_synchronous_standbys: a standby lost or gained shows within this long.
 */
export const replicationCheckIntervalMs = 10_000

/** How often the metrics sample the event loop's delay (prom-client's eventLoopMonitoringPrecision). */
export const eventLoopSampleIntervalMs = 100
export const readinessCheckTimeoutMs = 2_000

/**
 * Connections the operations HTTP server (metrics, probes) keeps at once; a connection past it is
 * closed at once. Far above what probes and scrapes use, so a few dozen idle sockets cannot starve
 * /healthz; httpHeadersTimeoutMs frees the slots of sockets that send nothing.
 */
export const httpConnectionsMax = 256

/**
 * How long the operations HTTP server waits for a whole request (headers and body) before closing the
 * socket. No endpoint takes a body: a request that announces one is answered 413 and closed at once.
 */
export const httpRequestTimeoutMs = 5_000

/**
 * Events recorded and not yet published, per partition (`QUOTA_EVENTS_OUTBOX_MAX`). Past it, a decision
 * that would record another event of that partition is refused (`unavailable`, nothing granted) until
 * the publisher catches up: an acknowledged change always has its event. Decisions that record no
 * event (most reserves and commits) go on. Also bounds the outbox's rows in Postgres.
 */
export const eventsOutboxPerPartitionMaxDefault = 100_000

/**
 * Events a partition's publisher has sent and not yet seen acknowledged, at most (pipelined, in order, on
 * one connection). A failed one is sent again with all after it. It also bounds what a new publisher
 * sends again of what the stream may already hold (EventPublisher.ts).
 */
export const eventsPublishInFlightMax = 64

/**
 * How long the publisher of a partition this process has just claimed waits for the partition's log to
 * be opened here before it reads the log: the open (bringing a previous owner's tail into the tables)
 * goes first on the pool, since serving waits for it and publishing does not. When hit, it reads anyway
 * (a store that fails the open fails the read too, which is retried).
 */
export const eventsRecoveryOpenWaitMsMax = 2_000

/**
 * Log rows a publisher reads per query (what earlier owners left unpublished, or what memory had no room
 * for); it reads on until memory holds eventsQueuedPerPartitionMax events or the log has no more.
 */
export const eventsRecoveryRowsMax = 256

/**
 * Events of a partition a publisher holds in memory to send. Past it, confirmed appends stay only in
 * the log and are read from it (eventsRecoveryRowsMax rows a query) once the publisher has sent what it
 * holds: memory stays bounded through a JetStream outage of any length (up to one read more).
 */
export const eventsQueuedPerPartitionMax = 4_096

/**
 * A starting publisher whose partition's last event in the stream is older than the duplicate window
 * less this margin looks up the events sent just before it one by one (a re-send would not be taken for
 * a repeat), reading at most eventsRecoveryScanMax messages of the stream; past it, what it did not find
 * is sent again (at most a second copy, with the same eventId).
 */
export const eventsDuplicateWindowMarginMs = 10_000
export const eventsRecoveryScanMax = 10_000

/** Backoff of a publisher whose publish failed (JetStream away): from the minimum, doubling, to the maximum. */
export const eventsRetryDelayMsMin = 250
export const eventsRetryDelayMsMax = 10_000

/** How long one publish waits for the stream's acknowledgement. */
export const eventsPublishTimeoutMs = 5_000

/** The process logs that events cannot be published at most once per this interval, not per event. */
export const eventsWarningIntervalMs = 60_000

/** The stream's duplicate window: at least 2 minutes (PROTOCOL.md), so a re-publish after a crash is kept once. */
export const eventsDuplicateWindowMsMin = 120_000

/**
 * Slots one user holds at once, whatever its plan says (with fairness off a plan allows any number).
 * An `acquire_slot` of a new job past it answers `limit_reached` (bound `slots`); held jobs still renew
 * and release. Bounds the memory and the work of a user's slots.
 */
export const slotsPerUserMax = 1_000

/**
 * Actors resting with `acquire_slot` waiters parked, apart from residentActorsMax (so they cannot fill
 * it and lock new users out). Past it, the actor that has rested longest with waiters is evicted and
 * each of its waiters answered `busy` (its wait over, with retryAfterMs; its place in the queue was
 * memory only). Resident actors in all: at most residentActorsMax + this.
 */
export const waitingActorsMax = 10_000

/**
 * How long the operations HTTP server waits for a request's headers. A socket that has not sent them
 * by then (idle, or dripping bytes) is closed: a probe or a scrape sends its few hundred bytes at once,
 * so idle sockets cannot hold the connection slots /healthz needs for longer than this (plus the check
 * interval below).
 */
export const httpHeadersTimeoutMs = 2_000

/**
 * How often the operations HTTP server looks for sockets past httpHeadersTimeoutMs or
 * httpRequestTimeoutMs. Node's default is 30 s, which let 64 idle sockets keep /healthz from
 * answering for about 45 s.
 */
export const httpTimeoutCheckIntervalMs = 500

/** How long a kept-alive connection to the operations HTTP server may sit idle between requests before it is closed. */
export const httpKeepAliveTimeoutMs = 2_000

/** Bytes of a request's headers to the operations HTTP server. Larger is answered 431 and the connection closed. */
export const httpHeaderBytesMax = 8_192

/**
 * How long a connection to the operations HTTP server may send and receive nothing before it is
 * closed. Node's headers timeout starts at a request's first byte, so a socket that never sends one
 * was kept until the client let go: 64 such sockets kept /healthz from answering. A /metrics scrape
 * whose answer took longer (an event loop stalled that long) is cut too; the next scrape tries again.
 */
export const httpIdleSocketTimeoutMs = 2_000

/**
 * Nesting of arrays and objects in one request body. A command is an object of scalars in an optional
 * batch array: 2 levels; the rest leaves room for unknown fields that carry structure. A deeper body
 * gets the NATS service error 400 before it is parsed: JSON.parse of 1 MiB of `[` took 138 ms (and
 * 300-900 ms on a shared machine) of the only thread.
 */
export const messageNestingDepthMax = 32

/**
 * Bytes of the holds one `list_holds` result carries (each hold's JSON and a comma). A listing stops
 * before the hold that would pass it and says `more: true`, so one result always fits the protocol's
 * 1 MiB payload with room to spare, whatever the ids hold.
 */
export const holdListReplyBytesMax = 262_144
