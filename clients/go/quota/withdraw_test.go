package quota

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A wait whose context ends is withdrawn (issue 30 item 1; PROTOCOL.md revision 1.2): when the slot it
// waited for frees, the next job gets it at once, not the vanished waiter.
func TestACancelledWaitGivesTheSlotToTheNextJob(t *testing.T) {
	ctx := testContext(t, 30*time.Second)
	h := newOps(t, ctx, testClient)
	user := unique("withdraw") // free plan: 1 slot
	wantStatus(t, "the first job", h.acquireSlot(AcquireSlot{User: user, Job: "first"}).Status, StatusAcquired)

	waitCtx, cancelWait := context.WithCancel(ctx)
	waited := make(chan error, 1)
	go func() {
		waited <- WithSlot(waitCtx, testClient, SlotJob{User: user, Job: "waiter", Wait: 20 * time.Second}, func(context.Context) error {
			return errors.New("the cancelled waiter ran")
		})
	}()
	for h.getUsage(GetUsage{User: user}).Slots.Waiting != 1 {
		time.Sleep(10 * time.Millisecond)
	}
	cancelWait()
	err := <-waited
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("the cancelled waiter: want context.Canceled, got %v", err)
	}

	wantStatus(t, "release the first job", h.releaseSlot(ReleaseSlot{User: user, Job: "first"}).Status, StatusReleased)
	next := h.acquireSlot(AcquireSlot{User: user, Job: "next"})
	usage := h.getUsage(GetUsage{User: user}).Slots
	t.Logf("after the release: next job %s (retry after %v); slots held %d by %+v, waiting %d", next.Status, next.RetryAfter, usage.Held, usage.Jobs, usage.Waiting)
	wantStatus(t, "the next job, once the first released its slot", next.Status, StatusAcquired)
	if usage.Held != 1 || usage.Jobs[0].Job != "next" || usage.Waiting != 0 {
		t.Fatalf("want the slot held by the next job alone and nobody waiting: %+v", usage)
	}
}
