package quota

import (
	"context"
	"errors"
	"testing"
	"time"
)

// ADR-10 in a River worker: a Free user's second job is snoozed while the first runs, and granted once
// the first ends.
func TestWithSlotSnoozesAFreeUsersSecondJobAndGrantsItAfterTheFirst(t *testing.T) {
	ctx := testContext(t, 30*time.Second)
	user := unique("river") // free plan: 1 slot
	firstStarted, finishFirst := make(chan struct{}), make(chan struct{})
	firstDone := make(chan error, 1)
	go func() {
		firstDone <- WithSlot(ctx, testClient, SlotJob{User: user, Job: "job-1"}, func(ctx context.Context) error {
			close(firstStarted)
			<-finishFirst
			return nil
		})
	}()
	<-firstStarted

	secondRan := false
	err := WithSlot(ctx, testClient, SlotJob{User: user, Job: "job-2"}, func(context.Context) error {
		secondRan = true
		return nil
	})
	var busy *SlotBusyError
	if !errors.As(err, &busy) || secondRan {
		t.Fatalf("the second job: want a SlotBusyError without running it, got %v (ran %v)", err, secondRan)
	}
	snooze, ok := RetryAfter(err)
	if !ok || snooze != busy.RetryAfter || snooze < testSnoozeBase || snooze > testSnoozeBase+testSnoozeJitter {
		t.Fatalf("RetryAfter %v: want the snooze base %v plus up to %v jitter", snooze, testSnoozeBase, testSnoozeJitter)
	}

	close(finishFirst)
	if err := <-firstDone; err != nil {
		t.Fatalf("the first job: %v", err)
	}
	if usage := newOps(t, ctx, testClient).getUsage(GetUsage{User: user}); usage.Slots.Held != 0 {
		t.Fatalf("the first job's slot was not released: %+v", usage.Slots)
	}
	err = WithSlot(ctx, testClient, SlotJob{User: user, Job: "job-2"}, func(context.Context) error {
		secondRan = true
		return nil
	})
	if err != nil || !secondRan {
		t.Fatalf("the second job after the first ended: %v (ran %v)", err, secondRan)
	}
}

// The lease is renewed while the job runs: with a 2s lease, a 3.5s job keeps its slot throughout.
func TestWithSlotRenewsTheLeaseWhileTheJobRuns(t *testing.T) {
	ctx := testContext(t, 30*time.Second)
	h := newOps(t, ctx, testClient)

	// The control: without renewal a 1s lease ends, and another job gets the slot. The coordinator frees
	// it twice QUOTA_CLOCK_OFFSET_MAX_MS (500ms by default) past the lease's end.
	control := unique("lease-control")
	wantStatus(t, "acquire", h.acquireSlot(AcquireSlot{User: control, Job: "a", Lease: time.Second}).Status, StatusAcquired)
	time.Sleep(time.Second + 2*500*time.Millisecond + 500*time.Millisecond)
	wantStatus(t, "after an unrenewed lease ended", h.acquireSlot(AcquireSlot{User: control, Job: "b"}).Status, StatusAcquired)

	user := unique("lease")
	var during []Status
	err := WithSlot(ctx, testClient, SlotJob{User: user, Job: "long", Lease: 2 * time.Second}, func(ctx context.Context) error {
		for i := 0; i < 5; i++ {
			time.Sleep(700 * time.Millisecond)
			during = append(during, h.acquireSlot(AcquireSlot{User: user, Job: "other"}).Status)
		}
		return ctx.Err()
	})
	if err != nil {
		t.Fatal(err)
	}
	for i, status := range during {
		if status != StatusBusy {
			t.Fatalf("at %dms another job's acquire was %q: the slot's 2s lease was not renewed", (i+1)*700, status)
		}
	}
	wantStatus(t, "after the job", h.acquireSlot(AcquireSlot{User: user, Job: "other"}).Status, StatusAcquired)
}

func TestWithSlotReleasesOnErrorAndPanic(t *testing.T) {
	ctx := testContext(t, 30*time.Second)
	h := newOps(t, ctx, testClient)
	user := unique("slot-failure")
	failure := errors.New("the job failed")
	if err := WithSlot(ctx, testClient, SlotJob{User: user, Job: "a"}, func(context.Context) error { return failure }); !errors.Is(err, failure) {
		t.Fatalf("want the job's error, got %v", err)
	}
	if held := h.getUsage(GetUsage{User: user}).Slots.Held; held != 0 {
		t.Fatalf("%d slots held after a failed job", held)
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the panic did not go on up")
			}
		}()
		_ = WithSlot(ctx, testClient, SlotJob{User: user, Job: "b"}, func(context.Context) error { panic("boom") })
	}()
	if held := h.getUsage(GetUsage{User: user}).Slots.Held; held != 0 {
		t.Fatalf("%d slots held after a panicking job", held)
	}
}

func TestWithHold(t *testing.T) {
	ctx := testContext(t, 30*time.Second)
	h := newOps(t, ctx, testClient)
	user := unique("withhold")
	setLimit(t, user, "tokens", 1000)

	commit, err := WithHold(ctx, testClient, Reserve{User: user, Meter: "tokens", Amount: 600, ID: "report-1"}, func(ctx context.Context, hold ReserveResult) (int64, error) {
		if hold.Status != StatusReserved || hold.Hold.Amount != 600 {
			t.Errorf("the work runs under the hold: %+v", hold)
		}
		return 450, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if commit.Status != StatusCommitted || commit.Meter.Used != 450 || commit.Meter.Reserved != 0 {
		t.Fatalf("commit of the actual 450: %+v %+v", commit.Outcome, commit.Meter)
	}

	failure := errors.New("analysis crashed")
	if _, err := WithHold(ctx, testClient, Reserve{User: user, Meter: "tokens", Amount: 500, ID: "report-2"}, func(context.Context, ReserveResult) (int64, error) {
		return 0, failure
	}); !errors.Is(err, failure) {
		t.Fatalf("want the work's error, got %v", err)
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the panic did not go on up")
			}
		}()
		_, _ = WithHold(ctx, testClient, Reserve{User: user, Meter: "tokens", Amount: 500, ID: "report-3"}, func(context.Context, ReserveResult) (int64, error) {
			panic("boom")
		})
	}()
	closed := h.listHolds(ListHolds{User: user, State: HoldsClosed})
	states := map[string]HoldState{}
	for _, hold := range closed.Holds {
		states[hold.ID] = hold.State
	}
	if states["report-1"] != HoldCommitted || states["report-2"] != HoldReleased || states["report-3"] != HoldReleased {
		t.Fatalf("holds after success, error and panic: %v", states)
	}
	if m := meterOf(t, user, "tokens"); m.Used != 450 || m.Reserved != 0 {
		t.Fatalf("used %d reserved %d, want 450 and nothing held", m.Used, m.Reserved)
	}

	ran := false
	_, err = WithHold(ctx, testClient, Reserve{User: user, Meter: "tokens", Amount: 600, ID: "report-4"}, func(context.Context, ReserveResult) (int64, error) {
		ran = true
		return 0, nil
	})
	var notGranted *HoldNotGrantedError
	if !errors.As(err, &notGranted) || ran || notGranted.Result.Status != StatusInsufficientQuota || notGranted.Result.Insufficient.Requested != 600 {
		t.Fatalf("past the limit: want HoldNotGrantedError(insufficient_quota) without running, got %v (ran %v)", err, ran)
	}
}

// A renewal that finds the lease gone (here: the slot released by someone else) cancels the work's
// context, and WithSlot says the lease was lost.
func TestWithSlotCancelsTheWorkWhenTheLeaseIsLost(t *testing.T) {
	ctx := testContext(t, 30*time.Second)
	h := newOps(t, ctx, testClient)
	user := unique("lease-lost")
	err := WithSlot(ctx, testClient, SlotJob{User: user, Job: "job", Lease: 3 * time.Second, RenewEvery: 200 * time.Millisecond}, func(ctx context.Context) error {
		wantStatus(t, "an operator frees the slot", h.releaseSlot(ReleaseSlot{User: user, Job: "job"}).Status, StatusReleased)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Second):
			return errors.New("the work's context was not cancelled")
		}
	})
	var lost *SlotLeaseLostError
	if !errors.As(err, &lost) || lost.Job != "job" || !errors.Is(err, context.Canceled) {
		t.Fatalf("want a SlotLeaseLostError wrapping the cancelled work, got %v", err)
	}
}

// A system job (empty user) counts against nothing and holds no lease: WithSlot runs it, renewals
// included, without taking the lease for lost.
func TestWithSlotRunsASystemJob(t *testing.T) {
	ctx := testContext(t, 30*time.Second)
	err := WithSlot(ctx, testClient, SlotJob{User: "", Job: unique("nightly"), Lease: time.Second, RenewEvery: 100 * time.Millisecond}, func(ctx context.Context) error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
			return nil
		}
	})
	if err != nil {
		t.Fatalf("a system job: %v", err)
	}
}
