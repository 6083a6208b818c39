package quota

import (
	"context"
	"errors"
	"sync"
	"time"
)

// defaultSlotLease is the coordinator's lease when acquire_slot names none (PROTOCOL.md).
const defaultSlotLease = 120 * time.Second

// SlotJob is a job to run in one of a user's slots.
type SlotJob struct {
	// User: empty for a system job, which is always acquired and counts against nothing.
	User string
	// Job names the job (River's job id, say): a retried job holding its slot gets exists.
	Job string
	// Lease: renewed while the job runs (zero: the coordinator's 2 min).
	Lease time.Duration
	// Wait: how long to wait in the user's queue for a slot before WithSlot gives up (zero: not at all).
	Wait time.Duration
	// RenewEvery: how often the lease is renewed (zero: a third of the lease).
	RenewEvery time.Duration
}

// WithSlot acquires a slot for job.Job, runs work while renewing the slot's lease, and releases the
// slot when work returns or panics. When every slot of the user stays taken through job.Wait it
// returns a *SlotBusyError carrying RetryAfter, the coordinator's snooze with its jitter (ADR-10): a
// River worker returns river.JobSnooze(busy.RetryAfter). Another refusal is a *SlotNotGrantedError.
//
// If a renewal finds the lease gone (not_found: the slot may be another job's now), work's context is
// cancelled and WithSlot returns a *SlotLeaseLostError wrapping what work returned. Otherwise it
// returns work's error, or the release's error when work succeeded and the release could not be sent.
func WithSlot(ctx context.Context, c *Client, job SlotJob, work func(ctx context.Context) error) error {
	slot, err := c.AcquireSlot(ctx, AcquireSlot{User: job.User, Job: job.Job, Lease: job.Lease, Wait: job.Wait})
	if err != nil {
		return err
	}
	if slot.Status == StatusBusy {
		return &SlotBusyError{User: job.User, Job: job.Job, RetryAfter: slot.RetryAfter, Result: slot}
	}
	if !slot.Granted() {
		return &SlotNotGrantedError{User: job.User, Job: job.Job, Result: slot}
	}
	lease := job.Lease
	if lease <= 0 {
		lease = defaultSlotLease
	}
	every := job.RenewEvery
	if every <= 0 {
		every = lease / 3
	}
	workCtx, cancelWork := context.WithCancel(ctx)
	defer cancelWork()
	renewal := noRenewal()
	// A system job (empty user) holds no slot: there is no lease to renew (renew_slot answers not_found).
	if job.User != "" {
		renewal = startRenewal(c, RenewSlot{User: job.User, Job: job.Job, Lease: job.Lease}, every, cancelWork)
	}

	release := func() error {
		renewal.stop()
		cleanup, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		defer cancel()
		_, err := c.ReleaseSlot(cleanup, ReleaseSlot{User: job.User, Job: job.Job})
		return err
	}
	workErr := runSlotWork(workCtx, work, release)
	releaseErr := release()
	if renewal.lost() {
		return &SlotLeaseLostError{User: job.User, Job: job.Job, WorkErr: workErr}
	}
	if workErr != nil {
		return workErr
	}
	return releaseErr
}

func runSlotWork(ctx context.Context, work func(ctx context.Context) error, release func() error) error {
	panicked := true
	defer func() {
		if panicked {
			_ = release()
		}
	}()
	err := work(ctx)
	panicked = false
	return err
}

// leaseRenewal renews one slot's lease every interval until stopped; one renewal at a time.
type leaseRenewal struct {
	stopOnce  sync.Once
	stopping  chan struct{}
	done      chan struct{}
	mu        sync.Mutex
	leaseGone bool
}

func startRenewal(c *Client, renew RenewSlot, every time.Duration, onLost context.CancelFunc) *leaseRenewal {
	r := &leaseRenewal{stopping: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(r.done)
		ticker := time.NewTicker(every)
		defer ticker.Stop()
		for {
			select {
			case <-r.stopping:
				return
			case <-ticker.C:
			}
			// Each renewal may take until the next is due; a renewal still in flight at stop is waited for,
			// so it cannot land after the release.
			ctx, cancel := context.WithTimeout(context.Background(), every)
			renewed, err := c.RenewSlot(ctx, renew)
			cancel()
			if err == nil && renewed.Status == StatusNotFound {
				r.mu.Lock()
				r.leaseGone = true
				r.mu.Unlock()
				onLost()
				return
			}
			// An error (retries exhausted, the client closed): the lease may still stand (it lasts three
			// intervals by default); try again at the next tick, where a lease that did end answers not_found.
			if errors.Is(err, ErrClosed) {
				return
			}
		}
	}()
	return r
}

func noRenewal() *leaseRenewal {
	r := &leaseRenewal{stopping: make(chan struct{}), done: make(chan struct{})}
	close(r.done)
	return r
}

func (r *leaseRenewal) stop() {
	r.stopOnce.Do(func() { close(r.stopping) })
	<-r.done
}

func (r *leaseRenewal) lost() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.leaseGone
}
