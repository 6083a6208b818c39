package quota

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// The operations of PROTOCOL.md, on {prefix}.v1.{partition}.ops. Each returns the result, whatever its
// status, or an error when the outcome could not be found out (see RetriesExhaustedError,
// ServiceError, TransportError, ErrClosed, and the context's own errors).

// Reserve asks for a hold.
func (c *Client) Reserve(ctx context.Context, in Reserve) (ReserveResult, error) {
	w, err := c.call(ctx, kindOps, holdTarget(in.User, in.ID), "reserve", reserveCommand{
		Op: "reserve", User: in.User, Meter: in.Meter, Amount: in.Amount, ID: in.ID, TTLMs: millis(in.TTL), Ref: in.Ref,
	}, 0)
	if err != nil {
		return ReserveResult{}, err
	}
	return w.reserveResult(), nil
}

// Consume moves an amount from a hold into usage now.
func (c *Client) Consume(ctx context.Context, in Consume) (HoldResult, error) {
	return c.holdCall(ctx, holdTarget(in.User, in.ID), "consume", consumeCommand{
		Op: "consume", User: in.User, ID: in.ID, Amount: in.Amount, Key: in.Key, Ref: in.Ref,
	})
}

// Commit ends a hold, charging the work's actual usage.
func (c *Client) Commit(ctx context.Context, in Commit) (HoldResult, error) {
	return c.holdCall(ctx, holdTarget(in.User, in.ID), "commit", commitCommand{
		Op: "commit", User: in.User, ID: in.ID, Amount: in.Amount, Ref: in.Ref,
	})
}

// Release ends a hold, returning its unconsumed rest.
func (c *Client) Release(ctx context.Context, in Release) (HoldResult, error) {
	return c.holdCall(ctx, holdTarget(in.User, in.ID), "release", holdIDCommand{Op: "release", User: in.User, ID: in.ID, Ref: in.Ref})
}

// Extend moves a hold's expiry.
func (c *Client) Extend(ctx context.Context, in Extend) (HoldResult, error) {
	return c.holdCall(ctx, holdTarget(in.User, in.ID), "extend", extendCommand{
		Op: "extend", User: in.User, ID: in.ID, TTLMs: millis(in.TTL), Ref: in.Ref,
	})
}

func (c *Client) holdCall(ctx context.Context, about target, op string, command any) (HoldResult, error) {
	w, err := c.call(ctx, kindOps, about, op, command, 0)
	if err != nil {
		return HoldResult{}, err
	}
	return w.holdResult(), nil
}

// Adjust changes usage directly: a charge or a refund.
func (c *Client) Adjust(ctx context.Context, in Adjust) (AdjustResult, error) {
	w, err := c.call(ctx, kindOps, target{user: in.User, what: describe("adjust", in.ID)}, "adjust", adjustCommand{
		Op: "adjust", User: in.User, Meter: in.Meter, Amount: in.Amount, ID: in.ID, Ref: in.Ref,
	}, 0)
	if err != nil {
		return AdjustResult{}, err
	}
	return w.adjustResult(), nil
}

// AcquireSlot asks for one of the user's slots. busy is an answer, not retried: the caller snoozes
// RetryAfter. With a Wait the command goes in a message of its own and waits for its reply that much
// longer. If ctx ends while the command waits, the wait is withdrawn before AcquireSlot returns
// ctx's error (PROTOCOL.md revision 1.2: the same job acquired again without a wait replaces the
// waiting request, which is answered busy), and a slot that answer grants is released: a job that
// stopped waiting never takes a slot when one frees.
func (c *Client) AcquireSlot(ctx context.Context, in AcquireSlot) (SlotResult, error) {
	wait := in.Wait
	if wait < 0 {
		wait = 0
	}
	about := slotTarget(in.User, in.Job)
	r, err := c.slotCall(ctx, about, "acquire_slot", slotCommand{
		Op: "acquire_slot", User: in.User, Job: in.Job, LeaseMs: millis(in.Lease), WaitMs: millis(wait), Ref: in.Ref,
	}, wait)
	if err != nil && wait > 0 && in.User != "" && ctx.Err() != nil {
		return r, c.withdrawWait(about, in, err)
	}
	return r, err
}

// withdrawWait replaces a waiting acquire_slot whose caller stopped waiting by one that does not wait,
// and releases what that grants (a slot free by then, or the one the wait got meanwhile). It runs on a
// context of its own, bounded by cleanupTimeout: the caller's has ended.
func (c *Client) withdrawWait(about target, in AcquireSlot, cause error) error {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	withdrawn, err := c.slotCall(ctx, about, "acquire_slot", slotCommand{
		Op: "acquire_slot", User: in.User, Job: in.Job, LeaseMs: millis(in.Lease), Ref: in.Ref,
	}, 0)
	if err == nil && withdrawn.Granted() {
		_, err = c.ReleaseSlot(ctx, ReleaseSlot{User: in.User, Job: in.Job})
	}
	if err != nil {
		return &WaitNotWithdrawnError{User: in.User, Job: in.Job, Err: cause, WithdrawErr: err}
	}
	return cause
}

// RenewSlot extends a slot's lease.
func (c *Client) RenewSlot(ctx context.Context, in RenewSlot) (SlotResult, error) {
	return c.slotCall(ctx, slotTarget(in.User, in.Job), "renew_slot", slotCommand{
		Op: "renew_slot", User: in.User, Job: in.Job, LeaseMs: millis(in.Lease), Ref: in.Ref,
	}, 0)
}

// ReleaseSlot frees a slot.
func (c *Client) ReleaseSlot(ctx context.Context, in ReleaseSlot) (SlotResult, error) {
	return c.slotCall(ctx, slotTarget(in.User, in.Job), "release_slot", slotCommand{Op: "release_slot", User: in.User, Job: in.Job, Ref: in.Ref}, 0)
}

func (c *Client) slotCall(ctx context.Context, about target, op string, command any, wait time.Duration) (SlotResult, error) {
	w, err := c.call(ctx, kindOps, about, op, command, wait)
	if err != nil {
		return SlotResult{}, err
	}
	return w.slotResult(), nil
}

// GetUsage returns the user's plan, meters and slots.
func (c *Client) GetUsage(ctx context.Context, in GetUsage) (UsageResult, error) {
	return c.usageCall(ctx, kindOps, in)
}

func (c *Client) usageCall(ctx context.Context, kind subjectKind, in GetUsage) (UsageResult, error) {
	w, err := c.call(ctx, kind, target{user: in.User}, "get_usage", userCommand{Op: "get_usage", User: in.User, Ref: in.Ref}, 0)
	if err != nil {
		return UsageResult{}, err
	}
	return w.usageResult(), nil
}

// Admin is the administration operations, on {prefix}.v1.{partition}.admin: NATS permissions may
// reserve them to operators, and then a service's call fails (the server refuses the publish).
type Admin struct {
	c *Client
}

// Admin returns the client's administration operations.
func (c *Client) Admin() Admin { return Admin{c: c} }

// SetPlan moves a user to a plan: ok, unknown_plan.
func (a Admin) SetPlan(ctx context.Context, in SetPlan) (AdminResult, error) {
	w, err := a.c.call(ctx, kindAdmin, target{user: in.User, what: describe("plan", in.Plan)}, "set_plan", setPlanCommand{Op: "set_plan", User: in.User, Plan: in.Plan, Ref: in.Ref}, 0)
	if err != nil {
		return AdminResult{}, err
	}
	return AdminResult{Outcome: w.outcome()}, nil
}

// SetLimit sets (or with a nil Limit clears) a user's own limit of a meter: ok, unknown_meter.
func (a Admin) SetLimit(ctx context.Context, in SetLimit) (AdminResult, error) {
	w, err := a.c.call(ctx, kindAdmin, target{user: in.User, what: describe("meter", in.Meter)}, "set_limit", setLimitCommand{
		Op: "set_limit", User: in.User, Meter: in.Meter, Limit: in.Limit, Ref: in.Ref,
	}, 0)
	if err != nil {
		return AdminResult{}, err
	}
	return AdminResult{Outcome: w.outcome()}, nil
}

// GetUsage is get_usage on the .admin subject.
func (a Admin) GetUsage(ctx context.Context, in GetUsage) (UsageResult, error) {
	return a.c.usageCall(ctx, kindAdmin, in)
}

// ListHolds lists a user's holds, oldest first.
func (a Admin) ListHolds(ctx context.Context, in ListHolds) (ListHoldsResult, error) {
	w, err := a.c.call(ctx, kindAdmin, target{user: in.User}, "list_holds", listHoldsCommand{
		Op: "list_holds", User: in.User, State: in.State, Limit: in.Limit, Ref: in.Ref,
	}, 0)
	if err != nil {
		return ListHoldsResult{}, err
	}
	return w.listHoldsResult(), nil
}

// UsageHistory returns a user's used per past period of each month or day meter, newest first
// (revision 1.3): ok, unknown_meter.
func (a Admin) UsageHistory(ctx context.Context, in UsageHistory) (UsageHistoryResult, error) {
	w, err := a.c.call(ctx, kindAdmin, target{user: in.User}, "usage_history", usageHistoryCommand{
		Op: "usage_history", User: in.User, Meter: in.Meter, Periods: in.Periods, Ref: in.Ref,
	}, 0)
	if err != nil {
		return UsageHistoryResult{}, err
	}
	return w.usageHistoryResult(), nil
}

// ListUsage returns one page of a partition's users whose used in one period is above 0, by their
// UTF-8 bytes (revision 1.3): ok (More: ask again with After set to the last user), unknown_meter,
// invalid_request. It goes to the partition's .admin subject, with no user.
func (a Admin) ListUsage(ctx context.Context, in ListUsage) (ListUsageResult, error) {
	about := partitionTarget(in.Partition)
	if in.Partition < 0 || in.Partition >= a.c.options.Partitions {
		return ListUsageResult{}, &CallError{Op: "list_usage", Target: about.what, Err: fmt.Errorf("partition must be 0 to %d", a.c.options.Partitions-1)}
	}
	command := listUsageCommand{Op: "list_usage", Meter: in.Meter, After: in.After, Limit: in.Limit, Ref: in.Ref}
	if !in.PeriodStart.IsZero() {
		start := in.PeriodStart.UnixMilli()
		command.PeriodStart = &start
	}
	subject := fmt.Sprintf("%s.v1.%d.%s", a.c.options.Prefix, in.Partition, kindAdmin)
	w, err := a.c.callSubject(ctx, subject, about, "list_usage", command, 0)
	if err != nil {
		return ListUsageResult{}, err
	}
	return w.listUsageResult(), nil
}

// UsagePages calls page with every page of every partition's list_usage of in.Meter and
// in.PeriodStart (in.Partition and in.After are set by the walk): partition 0 to the last, each
// paged until More is false, one request at a time, so memory stays one page whatever the deployment
// holds. It stops at the first error page returns, the first call that fails, or the first refusal
// (a *UsageListRefusedError carrying the result). A billing job runs it after the period ended.
func (a Admin) UsagePages(ctx context.Context, in ListUsage, page func(partition int, usage []UserUsage) error) error {
	for partition := 0; partition < a.c.options.Partitions; partition++ {
		in.Partition, in.After = partition, ""
		for {
			r, err := a.ListUsage(ctx, in)
			if err != nil {
				return err
			}
			if r.Status != StatusOK {
				return &UsageListRefusedError{Partition: partition, Meter: in.Meter, Result: r}
			}
			if err := page(partition, r.Usage); err != nil {
				return err
			}
			if !r.More {
				break
			}
			if len(r.Usage) == 0 {
				// More with no user to go on from: asking again would get the same page forever.
				subject := fmt.Sprintf("%s.v1.%d.%s", a.c.options.Prefix, partition, kindAdmin)
				return &CallError{Op: "list_usage", Target: partitionTarget(partition).what, Subject: subject,
					Err: &TransportError{Subject: subject, Reason: "reply says more with an empty usage list"}}
			}
			in.After = r.Usage[len(r.Usage)-1].User
		}
	}
	return nil
}

// target is what a call is about, for its errors: the user, and the hold, job, adjust or meter.
type target struct {
	user string
	// what: `hold "job-7"`, `job "42"`, ...; empty when the user is all there is.
	what string
}

func partitionTarget(partition int) target {
	return target{what: "partition " + strconv.Itoa(partition)}
}

func holdTarget(user, id string) target  { return target{user: user, what: describe("hold", id)} }
func slotTarget(user, job string) target { return target{user: user, what: describe("job", job)} }

func describe(kind, name string) string { return kind + " " + strconv.Quote(name) }

// String: `hold "job-7" of user "acct-42"`, or `user "acct-42"`; `partition 5` for list_usage, which
// has no user.
func (t target) String() string {
	if t.user == "" && strings.HasPrefix(t.what, "partition ") {
		return t.what
	}
	if t.what == "" {
		return "user " + strconv.Quote(t.user)
	}
	return t.what + " of user " + strconv.Quote(t.user)
}
