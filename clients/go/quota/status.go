package quota

// Status is a result's `status`. A refusal is a status like any other: the call succeeded in finding
// out. A status this client does not know (a later protocol revision) arrives as it is.
type Status string

// The statuses of PROTOCOL.md revision 1.2, by the operations that answer them.
const (
	// Holds: reserve, consume, commit, release, extend.
	StatusReserved          Status = "reserved"
	StatusConsumed          Status = "consumed"
	StatusCommitted         Status = "committed"
	StatusReleased          Status = "released" // release, release_slot
	StatusExtended          Status = "extended"
	StatusExists            Status = "exists" // an earlier identical command already applied (also adjust, acquire_slot)
	StatusConflict          Status = "conflict"
	StatusClosed            Status = "closed"
	StatusInsufficientQuota Status = "insufficient_quota"
	StatusUnknownMeter      Status = "unknown_meter"
	StatusNotFound          Status = "not_found"
	// adjust.
	StatusAdjusted Status = "adjusted"
	// Slots: acquire_slot, renew_slot, release_slot.
	StatusAcquired Status = "acquired"
	StatusBusy     Status = "busy"
	StatusRenewed  Status = "renewed"
	// get_usage, list_holds, set_plan, set_limit.
	StatusOK          Status = "ok"
	StatusUnknownPlan Status = "unknown_plan"
	// Any command.
	StatusInvalidRequest Status = "invalid_request"
	StatusWrongPartition Status = "wrong_partition"
	// Revision 1.2: a per-user bound of the service is reached; the result's LimitReached says which.
	StatusLimitReached Status = "limit_reached"
	// Retried by the client with the same command; a caller sees them only inside a
	// *RetriesExhaustedError (as its Reason), never as a result.
	StatusUnavailable Status = "unavailable"
	StatusOverloaded  Status = "overloaded"
)

// LimitBound names the per-user bound a limit_reached result hit (PROTOCOL.md revision 1.2).
type LimitBound string

const (
	BoundPendingHolds LimitBound = "pending_holds" // pending holds of the user: commit or release some
	BoundConsumeKeys  LimitBound = "consume_keys"  // consume keys of one hold: commit it
	BoundSlotWaiters  LimitBound = "slot_waiters"  // acquire_slot callers waiting for the user
	BoundSlots        LimitBound = "slots"         // slots held with fairness off: end jobs
)

// LimitReached is the body of a limit_reached result: nothing changed, and the same command retried
// unchanged gets the same answer until what the bound counts is freed.
type LimitReached struct {
	Bound LimitBound
	// Max is the bound's value.
	Max int64
}

// HoldState is a hold's life: pending, then exactly one of committed, released, expired.
type HoldState string

const (
	HoldPending   HoldState = "pending"
	HoldCommitted HoldState = "committed"
	HoldReleased  HoldState = "released"
	HoldExpired   HoldState = "expired"
)

// Period is a meter's period: month and day reset (UTC); none is a gauge that never resets.
type Period string

const (
	PeriodMonth Period = "month"
	PeriodDay   Period = "day"
	PeriodNone  Period = "none"
)

// HoldFilter selects the holds list_holds shows.
type HoldFilter string

const (
	HoldsPending HoldFilter = "pending"
	HoldsClosed  HoldFilter = "closed" // closed holds still remembered (the retry window)
	HoldsAll     HoldFilter = "all"
)
