package quota

import (
	"errors"
	"fmt"
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
	Op       string
	Subject  string
	Attempts int
	Reason   RetryReason
	// Err is the context's error when the deadline or a cancellation ended the retries.
	Err error
}

func (e *RetriesExhaustedError) Error() string {
	message := fmt.Sprintf("quota: %s on %s: %s after %d attempts", e.Op, e.Subject, e.Reason, e.Attempts)
	if e.Err != nil {
		message += " (" + e.Err.Error() + ")"
	}
	return message
}

func (e *RetriesExhaustedError) Unwrap() error { return e.Err }

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

// HoldNotGrantedError: WithHold's reserve was not reserved or exists (insufficient_quota, conflict,
// closed, limit_reached, ...). Result says which, with its numbers.
type HoldNotGrantedError struct {
	Result ReserveResult
}

func (e *HoldNotGrantedError) Error() string {
	return fmt.Sprintf("quota: hold %q not granted: %s", holdIDOf(e.Result), e.Result.Status)
}

func holdIDOf(r ReserveResult) string {
	if r.Hold != nil {
		return r.Hold.ID
	}
	return ""
}

// HoldNotCommittedError: WithHold's work finished but its commit was refused (the hold expired or was
// released meanwhile).
type HoldNotCommittedError struct {
	Result HoldResult
	Actual int64
}

func (e *HoldNotCommittedError) Error() string {
	return fmt.Sprintf("quota: hold not committed (actual %d): %s", e.Actual, e.Result.Status)
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
	return fmt.Sprintf("quota: no slot free for user %q (job %q): retry after %s", e.User, e.Job, e.RetryAfter)
}

// SlotNotGrantedError: WithSlot's acquire was refused for another reason than busy (invalid_request,
// wrong_partition, limit_reached).
type SlotNotGrantedError struct {
	Result SlotResult
}

func (e *SlotNotGrantedError) Error() string {
	return fmt.Sprintf("quota: slot not granted: %s", e.Result.Status)
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
