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

/** Commands in one batch message. A longer array gets the NATS service error 400. */
export const batchCommandsMax = 1_000

/** Bytes of one request body. A larger one gets the NATS service error 400. */
export const messageBytesMax = 1_048_576

/** How long a closed hold's id, its consume keys and an `adjust` id are remembered (the retry window). */
export const idRetentionMs = 7 * 86_400_000

/**
 * Pending holds one user may have at once. `reserve` past it answers `overloaded`: a user with ten
 * thousand pieces of work in flight is a runaway client, and each pending hold is scanned on expiry.
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

/** Distinct consume keys per hold. A new key past it answers `overloaded`. */
export const consumeKeysPerHoldMax = 10_000

/** Slot jobs (held) and waiters per user. A new waiter past it answers `busy` at once. */
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

/** Actors resident at once. A new user past it evicts the least recently used idle actor; if none is idle, `overloaded`. */
export const residentActorsMax = 100_000

/** An actor with nothing queued, no waiters and no write in flight is evicted after this idle time. */
export const actorIdleMs = 60_000

/** Store events written in one commit by the group-commit writer; the rest wait for the next commit. */
export const storeEventsPerCommitMax = 8_192

/** How often the orphan sweep looks for due holds and leases of users with no resident actor. */
export const sweepIntervalMs = 1_000

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
 * A group whose COMMIT's answer never came (the query timeout, a lost connection) may still commit on
 * the server. Before any user is loaded again, the store ends that transaction's backend and waits for
 * it to be gone, so the load sees its final outcome. Past this wait (the backend still there, or the
 * server unreachable) loads fail with `StoreUnavailable` and the next load tries again.
 */
export const storeOutcomeSettleWaitMs = 2_000

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
 * so their partitions are served again within about this, not after their leases.
 */
export const memberDeathCheckIntervalMs = 200

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
export const readinessCheckTimeoutMs = 2_000

/** Connections the operations HTTP server (metrics, probes) keeps at once; more are refused by the OS queue. */
export const httpConnectionsMax = 64

/** How long the operations HTTP server waits for a request's headers and body before closing the socket. */
export const httpRequestTimeoutMs = 10_000

/**
 * Events recorded and not yet published, per partition (`QUOTA_EVENTS_OUTBOX_MAX`). Past it, a decision
 * that would record another event of that partition is refused (`unavailable`, nothing granted) until
 * the publisher catches up: an acknowledged change always has its event. Decisions that record no
 * event (most reserves and commits) go on. Also bounds the outbox's rows in Postgres.
 */
export const eventsOutboxPerPartitionMaxDefault = 100_000

/** Outbox rows one publisher reads (and deletes once published) at a time. */
export const eventsPublishBatchMax = 256

/**
 * How often a partition's publisher looks at its outbox again while it knows of rows not yet published
 * (a batch that left more, a count that says rows wait). An idle partition (its outbox empty as far as
 * this process knows) does not poll: it is woken by the commits that record its events.
 */
export const eventsPollIntervalMs = 1_000

/**
 * How often the publisher counts the outboxes of all its partitions in one statement, to find rows
 * nobody woke it for (a commit whose outcome was unknown, then committed). Idle, that is the only read
 * the events make: once per this interval whatever the number of partitions.
 */
export const eventsIdleRecheckIntervalMs = 30_000

/** Backoff of a publisher whose publish failed (JetStream away): from the minimum, doubling, to the maximum. */
export const eventsRetryDelayMsMin = 250
export const eventsRetryDelayMsMax = 10_000

/** How long one publish waits for the stream's acknowledgement. */
export const eventsPublishTimeoutMs = 5_000

/** The process logs that events cannot be published at most once per this interval, not per event. */
export const eventsWarningIntervalMs = 60_000

/** The stream's duplicate window: at least 2 minutes (PROTOCOL.md), so a re-publish after a crash is kept once. */
export const eventsDuplicateWindowMsMin = 120_000
