package quota

import (
	"context"
	"time"
)

// cleanupTimeout bounds the release (or commit) WithHold and WithSlot send after the work ended. It
// runs on a context of its own: the caller's may be what ended the work (a job's timeout), and the
// hold or slot must still be given back.
const cleanupTimeout = 10 * time.Second

// HoldWork is the work run under a hold: it returns the amount it actually used, which WithHold
// commits. The hold is the reserve's result (reserved, or exists when a retried job finds its hold).
type HoldWork func(ctx context.Context, hold ReserveResult) (actual int64, err error)

// WithHold reserves, runs work, and commits the amount work reports; it releases the hold when work
// returns an error or panics (and then returns that error, or panics again). The hold's ID names the
// work: a retried job with the same ID finds its own hold (exists) instead of reserving twice.
//
// It returns the commit's result (committed, or exists when this hold was already committed), a
// *HoldNotGrantedError when the reserve grants nothing (insufficient_quota, conflict, closed,
// limit_reached, ...: the result inside says which), a *HoldNotCommittedError when the commit is
// refused (the hold expired or was released while the work ran), or the client's error.
func WithHold(ctx context.Context, c *Client, reserve Reserve, work HoldWork) (commit HoldResult, err error) {
	hold, err := c.Reserve(ctx, reserve)
	if err != nil {
		return HoldResult{}, err
	}
	if !hold.Granted() {
		return HoldResult{}, &HoldNotGrantedError{User: reserve.User, ID: reserve.ID, Meter: reserve.Meter, Amount: reserve.Amount, Result: hold}
	}
	release := func() {
		// The work's error is what the caller needs. If the release fails as well, the hold still
		// expires at its TTL and returns its amount then.
		cleanup, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		defer cancel()
		_, _ = c.Release(cleanup, Release{User: reserve.User, ID: reserve.ID})
	}
	actual, err := runHoldWork(ctx, work, hold, release)
	if err != nil {
		release()
		return HoldResult{}, err
	}
	commitCtx := ctx
	if ctx.Err() != nil {
		// The work is done and used what it used: charge it even when the caller's context ended meanwhile
		// (a job's timeout), rather than leave the hold to expire uncharged.
		var cancel context.CancelFunc
		commitCtx, cancel = context.WithTimeout(context.Background(), cleanupTimeout)
		defer cancel()
	}
	commit, err = c.Commit(commitCtx, Commit{User: reserve.User, ID: reserve.ID, Amount: Int64(actual)})
	if err != nil {
		return HoldResult{}, err
	}
	if commit.Status != StatusCommitted && commit.Status != StatusExists {
		return commit, &HoldNotCommittedError{User: reserve.User, ID: reserve.ID, Result: commit, Actual: actual}
	}
	return commit, nil
}

// runHoldWork runs work, releasing the hold before a panic goes on up.
func runHoldWork(ctx context.Context, work HoldWork, hold ReserveResult, release func()) (actual int64, err error) {
	panicked := true
	defer func() {
		if panicked {
			release()
		}
	}()
	actual, err = work(ctx, hold)
	panicked = false
	return actual, err
}
