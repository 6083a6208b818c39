package quota

import "time"

// The inputs of the operations, one struct per op (PROTOCOL.md "Operations" and "Administration").
// A zero duration or an empty optional field is left out of the command, so the coordinator applies its
// default. Values are not checked here: the coordinator judges them and answers invalid_request,
// naming the field. Durations go on the wire in whole milliseconds (truncated).
//
// Ref, on every command, is echoed back on its result whatever the status (at most 256 bytes).

// Reserve asks for a hold of Amount of Meter for the work named ID (the job id, unique per user).
type Reserve struct {
	User   string
	Meter  string
	Amount int64
	ID     string
	// TTL: the hold expires after it unless extended (1s to 24h; zero: the coordinator's 1h).
	TTL time.Duration
	Ref string
}

// Consume moves Amount from hold ID into usage now; Key makes it idempotent within the hold.
type Consume struct {
	User   string
	ID     string
	Amount int64
	Key    string
	Ref    string
}

// Commit ends hold ID charging the work's total actual usage. Amount nil: the larger of the hold's
// amount and what was consumed (use Int64(n) for an amount, Int64(0) for nothing used).
type Commit struct {
	User   string
	ID     string
	Amount *int64
	Ref    string
}

// Release ends hold ID returning its unconsumed rest.
type Release struct {
	User string
	ID   string
	Ref  string
}

// Extend moves hold ID's expiry to now + TTL (1s to 24h).
type Extend struct {
	User string
	ID   string
	TTL  time.Duration
	Ref  string
}

// Adjust changes usage directly by Amount (signed: a charge, or a refund such as a deleted file);
// ID makes it idempotent (a namespace separate from hold ids).
type Adjust struct {
	User   string
	Meter  string
	Amount int64
	ID     string
	Ref    string
}

// AcquireSlot asks for one of User's slots for Job. User empty: a system job, always acquired.
type AcquireSlot struct {
	User string
	Job  string
	// Lease: the slot is freed after it without RenewSlot (1s to 1h; zero: the coordinator's 2 min).
	Lease time.Duration
	// Wait: how long to wait in the user's FIFO queue for a slot before answering busy (up to 5 min;
	// zero: answer at once). A waiting command goes in a message of its own.
	Wait time.Duration
	Ref  string
}

// RenewSlot extends Job's lease (Lease zero: the coordinator's default).
type RenewSlot struct {
	User  string
	Job   string
	Lease time.Duration
	Ref   string
}

// ReleaseSlot frees Job's slot.
type ReleaseSlot struct {
	User string
	Job  string
	Ref  string
}

// GetUsage asks for User's plan, meters and slots.
type GetUsage struct {
	User string
	Ref  string
}

// SetPlan moves User to Plan (administration).
type SetPlan struct {
	User string
	Plan string
	Ref  string
}

// SetLimit sets User's own limit of Meter; Limit nil returns it to the plan's default (administration).
type SetLimit struct {
	User  string
	Meter string
	Limit *int64
	Ref   string
}

// ListHolds lists User's holds, oldest first (administration). State empty: pending; Limit zero: 100.
type ListHolds struct {
	User  string
	State HoldFilter
	Limit int
	Ref   string
}

// UsageHistory asks for User's used per past period, newest first (administration, revision 1.3).
// Meter empty: every meter whose period is month or day (a none meter is invalid_request); Periods
// zero: 12 (1 to 36), the current period counted.
type UsageHistory struct {
	User    string
	Meter   string
	Periods int
	Ref     string
}

// ListUsage asks one partition for its users whose used in one period of Meter is above 0, by their
// UTF-8 bytes (administration, revision 1.3; sent to the partition's .admin subject, with no user).
// PeriodStart is the start of one of the meter's periods, not later than the current one; zero for a
// none meter, whose current value is listed. After: list the users after it (the last user of the
// previous page). Limit zero: 1000 (1 to 1000).
type ListUsage struct {
	Partition   int
	Meter       string
	PeriodStart time.Time
	After       string
	Limit       int
	Ref         string
}

// Int64 returns a pointer to n: for Commit.Amount and SetLimit.Limit.
func Int64(n int64) *int64 { return &n }

// What goes on the wire: `op` first, optional fields left out when absent.

type reserveCommand struct {
	Op     string `json:"op"`
	User   string `json:"user"`
	Meter  string `json:"meter"`
	Amount int64  `json:"amount"`
	ID     string `json:"id"`
	TTLMs  int64  `json:"ttlMs,omitempty"`
	Ref    string `json:"ref,omitempty"`
}

type consumeCommand struct {
	Op     string `json:"op"`
	User   string `json:"user"`
	ID     string `json:"id"`
	Amount int64  `json:"amount"`
	Key    string `json:"key"`
	Ref    string `json:"ref,omitempty"`
}

type commitCommand struct {
	Op     string `json:"op"`
	User   string `json:"user"`
	ID     string `json:"id"`
	Amount *int64 `json:"amount,omitempty"`
	Ref    string `json:"ref,omitempty"`
}

// release, release_slot's cousin: user and id.
type holdIDCommand struct {
	Op   string `json:"op"`
	User string `json:"user"`
	ID   string `json:"id"`
	Ref  string `json:"ref,omitempty"`
}

type extendCommand struct {
	Op    string `json:"op"`
	User  string `json:"user"`
	ID    string `json:"id"`
	TTLMs int64  `json:"ttlMs"`
	Ref   string `json:"ref,omitempty"`
}

type adjustCommand struct {
	Op     string `json:"op"`
	User   string `json:"user"`
	Meter  string `json:"meter"`
	Amount int64  `json:"amount"`
	ID     string `json:"id"`
	Ref    string `json:"ref,omitempty"`
}

type slotCommand struct {
	Op      string `json:"op"`
	User    string `json:"user"`
	Job     string `json:"job"`
	LeaseMs int64  `json:"leaseMs,omitempty"`
	WaitMs  int64  `json:"waitMs,omitempty"`
	Ref     string `json:"ref,omitempty"`
}

type userCommand struct {
	Op   string `json:"op"`
	User string `json:"user"`
	Ref  string `json:"ref,omitempty"`
}

type setPlanCommand struct {
	Op   string `json:"op"`
	User string `json:"user"`
	Plan string `json:"plan"`
	Ref  string `json:"ref,omitempty"`
}

// limit is required: null (nil) returns the meter to the plan's default.
type setLimitCommand struct {
	Op    string `json:"op"`
	User  string `json:"user"`
	Meter string `json:"meter"`
	Limit *int64 `json:"limit"`
	Ref   string `json:"ref,omitempty"`
}

type listHoldsCommand struct {
	Op    string     `json:"op"`
	User  string     `json:"user"`
	State HoldFilter `json:"state,omitempty"`
	Limit int        `json:"limit,omitempty"`
	Ref   string     `json:"ref,omitempty"`
}

type usageHistoryCommand struct {
	Op      string `json:"op"`
	User    string `json:"user"`
	Meter   string `json:"meter,omitempty"`
	Periods int    `json:"periods,omitempty"`
	Ref     string `json:"ref,omitempty"`
}

// No user: the subject names the partition.
type listUsageCommand struct {
	Op          string `json:"op"`
	Meter       string `json:"meter"`
	PeriodStart *int64 `json:"periodStart,omitempty"`
	After       string `json:"after,omitempty"`
	Limit       int    `json:"limit,omitempty"`
	Ref         string `json:"ref,omitempty"`
}

func millis(d time.Duration) int64 { return d.Milliseconds() }
