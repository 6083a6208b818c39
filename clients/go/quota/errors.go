package quota

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// The client's errors: what a call could not find out. A protocol answer (insufficient_quota, busy,
// invalid_request, limit_reached, ...) is a result, not one of these; only WithHold and WithSlot turn
// a refusal into an error, because they cannot run the work without the grant.

// RetryReason is why the last attempt of a retried command did not decide it.
type RetryReason string

const (
	RetryUnavailable  RetryReason = "unavailable"   // the decision could not be confirmed durable
	RetryOverloaded   RetryReason = "overloaded"    // the user's mailbox was full
	RetryNoResponders RetryReason = "no_responders" // no coordinator owned the partition
	RetryTimeout      RetryReason = "timeout"       // the message got no reply in time
)

// RetriesExhaustedError: every attempt got a retryable outcome until the context's deadline (or
// Options.Retry.AttemptsMax). For unavailable and timeout the command may still have taken effect: a
// later call with the same id/job/key says what stands.
type RetriesExhaustedError struct {
	Op string
	// User and Target say what the command was about: Target is `hold "job-7"`, `job "42"`, ... or empty.
	User     string
	Target   string
	Subject  string
	Attempts int
	Reason   RetryReason
	// Elapsed: from the first attempt to the error.
	Elapsed time.Duration
	// Err is the context's error when the deadline or a cancellation ended the retries.
	Err error
}

func (e *RetriesExhaustedError) Error() string {
	message := fmt.Sprintf("quota: %s of %s on %s: %s after %d attempts in %s", e.Op, target{user: e.User, what: e.Target},
		e.Subject, e.Reason, e.Attempts, e.Elapsed.Round(time.Millisecond))
	if e.Err != nil {
		message += " (" + e.Err.Error() + ")"
	}
	return message
}

func (e *RetriesExhaustedError) Unwrap() error { return e.Err }

// CallError: a call failed for a reason other than retries running out (its context ended before an
// answer, the client closed, a *ServiceError, a *TransportError); it says which command, and Err why.
type CallError struct {
	Op      string
	User    string
	Target  string
	Subject string
	Err     error
}

func (e *CallError) Error() string {
	return fmt.Sprintf("quota: %s of %s on %s: %s", e.Op, target{user: e.User, what: e.Target}, e.Subject,
		strings.TrimPrefix(e.Err.Error(), "quota: "))
}

func (e *CallError) Unwrap() error { return e.Err }

// UsageListRefusedError: UsagePages stopped at a partition that refused list_usage: unknown_meter, or
// invalid_request (a PeriodStart that is not one of the meter's periods, or one given for a none
// meter). The pages before it were delivered all the same.
type UsageListRefusedError struct {
	Partition int
	Meter     string
	Result    ListUsageResult
}

func (e *UsageListRefusedError) Error() string {
	message := fmt.Sprintf("quota: list_usage of meter %q on partition %d refused: %s", e.Meter, e.Partition, e.Result.Status)
	if e.Result.Invalid != "" {
		message += " (" + e.Result.Invalid + ")"
	}
	return message
}

// ServiceError: the coordinator refused the whole message with the NATS service error headers (400:
// not JSON, too large, a batch over the limit). Not retried: the same message would be refused again.
type ServiceError struct {
	Subject     string
	Code        int
	Description string
}

func (e *ServiceError) Error() string {
	return fmt.Sprintf("quota: %s answered service error %d: %s", e.Subject, e.Code, e.Description)
}

// TransportError: NATS failed in a way retrying cannot fix (connection closed, a payload over the
// server's maximum), or the reply broke the protocol (not JSON, not one result per command).
type TransportError struct {
	Subject string
	Reason  string
	Err     error
}

func (e *TransportError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("quota: %s: %s: %v", e.Subject, e.Reason, e.Err)
	}
	return fmt.Sprintf("quota: %s: %s", e.Subject, e.Reason)
}

func (e *TransportError) Unwrap() error { return e.Err }

// ErrClosed: the client was closed before the command could be decided.
var ErrClosed = errors.New("quota: the client is closed")

// LimitReachedError: a per-user bound of the service is reached (PROTOCOL.md revision 1.2): nothing
// changed, and the same command gets the same answer until what the bound counts is freed (commit or
// release holds, end jobs). WithHold and WithSlot return it wrapped in their *HoldNotGrantedError or
// *SlotNotGrantedError: errors.As finds either. A worker gives the job up (river.JobCancel) rather
// than retrying it on a backoff.
type LimitReachedError struct {
	Op     string
	User   string
	Target string // `hold "job-7"`, `job "42"`
	Bound  LimitBound
	Max    int64
}

func (e *LimitReachedError) Error() string {
	return fmt.Sprintf("quota: %s of %s: limit_reached: %s at its max of %d", e.Op, target{user: e.User, what: e.Target}, e.Bound, e.Max)
}

// limitReachedOf is the *LimitReachedError of a limit_reached result, nil for any other.
func limitReachedOf(op string, about target, o Outcome) error {
	if o.Status != StatusLimitReached || o.LimitReached == nil {
		return nil
	}
	return &LimitReachedError{Op: op, User: about.user, Target: about.what, Bound: o.LimitReached.Bound, Max: o.LimitReached.Max}
}

// HoldNotGrantedError: WithHold's reserve was not reserved or exists (insufficient_quota, conflict,
// closed, limit_reached, ...). Result says which, with its numbers; for limit_reached, errors.As also
// finds a *LimitReachedError.
type HoldNotGrantedError struct {
	User   string
	ID     string
	Meter  string
	Amount int64
	Result ReserveResult
}

func (e *HoldNotGrantedError) Error() string {
	return fmt.Sprintf("quota: reserve of %s (%d %s): %s", holdTarget(e.User, e.ID), e.Amount, e.Meter, figures(e.Result.Outcome, e.Result.Meter, e.Result.Hold, e.Result.Insufficient))
}

func (e *HoldNotGrantedError) Unwrap() error {
	return limitReachedOf("reserve", holdTarget(e.User, e.ID), e.Result.Outcome)
}

// HoldNotCommittedError: WithHold's work finished but its commit was refused (the hold expired or was
// released meanwhile).
type HoldNotCommittedError struct {
	User   string
	ID     string
	Result HoldResult
	Actual int64
}

func (e *HoldNotCommittedError) Error() string {
	return fmt.Sprintf("quota: commit of %s (actual %d): %s", holdTarget(e.User, e.ID), e.Actual, figures(e.Result.Outcome, e.Result.Meter, e.Result.Hold, nil))
}

func (e *HoldNotCommittedError) Unwrap() error {
	return limitReachedOf("commit", holdTarget(e.User, e.ID), e.Result.Outcome)
}

// SlotBusyError: every slot of the user stayed taken through the wait. RetryAfter is the coordinator's
// snooze (base + jitter): a River worker returns river.JobSnooze(err.RetryAfter).
type SlotBusyError struct {
	User       string
	Job        string
	RetryAfter time.Duration
	Result     SlotResult
}

func (e *SlotBusyError) Error() string {
	return fmt.Sprintf("quota: acquire_slot of %s: busy (%s): retry after %s", slotTarget(e.User, e.Job), slotFigures(e.Result), e.RetryAfter)
}

// SlotNotGrantedError: WithSlot's acquire was refused for another reason than busy (invalid_request,
// wrong_partition, limit_reached); for limit_reached, errors.As also finds a *LimitReachedError.
type SlotNotGrantedError struct {
	User   string
	Job    string
	Result SlotResult
}

func (e *SlotNotGrantedError) Error() string {
	message := fmt.Sprintf("quota: acquire_slot of %s: %s", slotTarget(e.User, e.Job), figures(e.Result.Outcome, nil, nil, nil))
	if e.Result.Status != StatusLimitReached && e.Result.Status != StatusInvalidRequest {
		message += " (" + slotFigures(e.Result) + ")"
	}
	return message
}

func (e *SlotNotGrantedError) Unwrap() error {
	return limitReachedOf("acquire_slot", slotTarget(e.User, e.Job), e.Result.Outcome)
}

// WaitNotWithdrawnError: AcquireSlot's context ended while it waited, and withdrawing the wait failed:
// the job may still take a slot when one frees, until its lease ends. Err is the context's error.
type WaitNotWithdrawnError struct {
	User        string
	Job         string
	Err         error
	WithdrawErr error
}

func (e *WaitNotWithdrawnError) Error() string {
	return fmt.Sprintf("quota: acquire_slot of %s stopped waiting (%v), and withdrawing the wait failed: %v",
		slotTarget(e.User, e.Job), e.Err, strings.TrimPrefix(e.WithdrawErr.Error(), "quota: "))
}

func (e *WaitNotWithdrawnError) Unwrap() error { return e.Err }

// figures: a result's status and the numbers it carried.
func figures(o Outcome, meter *MeterState, hold *Hold, insufficient *Insufficient) string {
	parts := []string{string(o.Status)}
	switch {
	case o.LimitReached != nil:
		parts = append(parts, fmt.Sprintf("%s at its max of %d", o.LimitReached.Bound, o.LimitReached.Max))
	case o.Invalid != "":
		parts = append(parts, o.Invalid)
	}
	if insufficient != nil {
		parts = append(parts, fmt.Sprintf("requested %d, pending holds %d", insufficient.Requested, insufficient.PendingHolds))
	}
	if meter != nil {
		parts = append(parts, fmt.Sprintf("%s: available %d of limit %d (used %d, reserved %d)", meter.Meter, meter.Available, meter.Limit, meter.Used, meter.Reserved))
	}
	if hold != nil {
		parts = append(parts, fmt.Sprintf("hold %q %s, amount %d, consumed %d", hold.ID, hold.State, hold.Amount, hold.Consumed))
	}
	return strings.Join(parts, "; ")
}

func slotFigures(r SlotResult) string {
	if r.Limit == nil {
		return fmt.Sprintf("%d slots held, no limit", r.Held)
	}
	return fmt.Sprintf("%d of %d slots held", r.Held, *r.Limit)
}

// SlotLeaseLostError: a renewal answered not_found while the work ran: the lease had ended and the
// slot may be another job's now. WithSlot cancelled the work's context.
type SlotLeaseLostError struct {
	User string
	Job  string
	// WorkErr is what the work returned after its context was cancelled.
	WorkErr error
}

func (e *SlotLeaseLostError) Error() string {
	return fmt.Sprintf("quota: slot lease of job %q (user %q) was lost", e.Job, e.User)
}

func (e *SlotLeaseLostError) Unwrap() error { return e.WorkErr }

// RetryAfter returns how long to snooze when err is (or wraps) a *SlotBusyError.
func RetryAfter(err error) (time.Duration, bool) {
	var busy *SlotBusyError
	if errors.As(err, &busy) {
		return busy.RetryAfter, true
	}
	return 0, false
}
