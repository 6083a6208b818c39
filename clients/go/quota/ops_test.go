package quota

import (
	"testing"
	"time"
)

// Each operation's happy path and refusals against the real coordinator (default configuration: the
// free plan has analysis 5 000 a month, 1 slot).

func wantStatus(t *testing.T, what string, got, want Status) {
	t.Helper()
	if got != want {
		t.Fatalf("%s: status %q, want %q", what, got, want)
	}
}

// setLimit gives user its own limit of meter, for tests that need a small one.
func setLimit(t *testing.T, user, meter string, limit int64) {
	t.Helper()
	r := newOps(t, testContext(t, 10*time.Second), testClient).setLimit(SetLimit{User: user, Meter: meter, Limit: Int64(limit)})
	wantStatus(t, "set_limit", r.Status, StatusOK)
}

func meterOf(t *testing.T, user, meter string) MeterUsage {
	t.Helper()
	usage := newOps(t, testContext(t, 10*time.Second), testClient).getUsage(GetUsage{User: user})
	wantStatus(t, "get_usage", usage.Status, StatusOK)
	m, ok := usage.Meter(meter)
	if !ok {
		t.Fatalf("get_usage has no meter %q: %+v", meter, usage.Meters)
	}
	return m
}

func TestReserve(t *testing.T) {
	ctx := testContext(t, 20*time.Second)
	h := newOps(t, ctx, testClient)
	user := unique("reserve")
	setLimit(t, user, "analysis", 100)

	r := h.reserve(Reserve{User: user, Meter: "analysis", Amount: 60, ID: "job-1", Ref: "r1", TTL: time.Minute})
	wantStatus(t, "reserve", r.Status, StatusReserved)
	if !r.Granted() || r.Ref != "r1" || r.Meter == nil || r.Hold == nil {
		t.Fatalf("reserved result incomplete: %+v", r)
	}
	if *r.Meter != (MeterState{Meter: "analysis", Limit: 100, Used: 0, Reserved: 60, Available: 40, Overage: 0}) {
		t.Fatalf("meter state %+v", *r.Meter)
	}
	if r.Hold.ID != "job-1" || r.Hold.Amount != 60 || r.Hold.State != HoldPending {
		t.Fatalf("hold %+v", *r.Hold)
	}
	if until := time.Until(r.Hold.ExpiresAt); until < 50*time.Second || until > 70*time.Second {
		t.Fatalf("expiresAt %v is not about a minute away (ttl 1 min)", r.Hold.ExpiresAt)
	}

	again := h.reserve(Reserve{User: user, Meter: "analysis", Amount: 60, ID: "job-1"})
	wantStatus(t, "the same reserve again", again.Status, StatusExists)
	if !again.Granted() || again.Meter.Reserved != 60 {
		t.Fatalf("exists must be the hold unchanged, counted once: %+v", *again.Meter)
	}

	conflict := h.reserve(Reserve{User: user, Meter: "analysis", Amount: 61, ID: "job-1"})
	wantStatus(t, "same id, other amount", conflict.Status, StatusConflict)
	if conflict.Granted() || conflict.Hold == nil || conflict.Hold.Amount != 60 {
		t.Fatalf("conflict carries the existing hold: %+v", conflict)
	}

	short := h.reserve(Reserve{User: user, Meter: "analysis", Amount: 41, ID: "job-2"})
	wantStatus(t, "past the limit", short.Status, StatusInsufficientQuota)
	if short.Insufficient == nil || *short.Insufficient != (Insufficient{Requested: 41, PendingHolds: 1}) {
		t.Fatalf("insufficient_quota must carry requested and pendingHolds: %+v", short.Insufficient)
	}
	if short.Meter == nil || short.Meter.Available != 40 || short.Hold != nil {
		t.Fatalf("insufficient_quota carries the meter, no hold: %+v", short)
	}
	fits := h.reserve(Reserve{User: user, Meter: "analysis", Amount: 40, ID: "job-2"})
	wantStatus(t, "exactly what is left", fits.Status, StatusReserved)

	unknown := h.reserve(Reserve{User: user, Meter: "no_such_meter", Amount: 1, ID: "job-3"})
	wantStatus(t, "unknown meter", unknown.Status, StatusUnknownMeter)
	if unknown.Meter != nil || unknown.Hold != nil {
		t.Fatalf("unknown_meter carries no meter state: %+v", unknown)
	}

	invalid := h.reserve(Reserve{User: user, Meter: "Not-A-Meter", Amount: 1, ID: "job-4"})
	wantStatus(t, "malformed meter name", invalid.Status, StatusInvalidRequest)
	if invalid.Invalid == "" {
		t.Fatal("invalid_request must say what is wrong")
	}
	negative := h.reserve(Reserve{User: user, Meter: "analysis", Amount: -1, ID: "job-5"})
	wantStatus(t, "negative amount", negative.Status, StatusInvalidRequest)
	shortTTL := h.reserve(Reserve{User: user, Meter: "analysis", Amount: 1, ID: "job-6", TTL: 10 * time.Millisecond})
	wantStatus(t, "ttl below 1s", shortTTL.Status, StatusInvalidRequest)

	committed := h.commit(Commit{User: user, ID: "job-2"})
	wantStatus(t, "commit", committed.Status, StatusCommitted)
	closed := h.reserve(Reserve{User: user, Meter: "analysis", Amount: 1, ID: "job-2"})
	wantStatus(t, "a committed id", closed.Status, StatusClosed)
	if closed.Hold == nil || closed.Hold.State != HoldCommitted {
		t.Fatalf("closed carries the existing hold: %+v", closed.Hold)
	}
}

func TestConsume(t *testing.T) {
	ctx := testContext(t, 20*time.Second)
	h := newOps(t, ctx, testClient)
	user := unique("consume")
	wantStatus(t, "reserve", h.reserve(Reserve{User: user, Meter: "tokens", Amount: 1000, ID: "report"}).Status, StatusReserved)

	first := h.consume(Consume{User: user, ID: "report", Amount: 300, Key: "chunk-1"})
	wantStatus(t, "consume", first.Status, StatusConsumed)
	if first.Hold.Consumed != 300 || first.Meter.Used != 300 || first.Meter.Reserved != 700 {
		t.Fatalf("consume moves the amount from the hold into usage: hold %+v meter %+v", *first.Hold, *first.Meter)
	}
	repeat := h.consume(Consume{User: user, ID: "report", Amount: 300, Key: "chunk-1"})
	wantStatus(t, "the same key again", repeat.Status, StatusExists)
	if repeat.Meter.Used != 300 {
		t.Fatalf("a repeated key applies nothing twice: used %d", repeat.Meter.Used)
	}
	wantStatus(t, "unknown hold", h.consume(Consume{User: user, ID: "nope", Amount: 1, Key: "k"}).Status, StatusNotFound)

	wantStatus(t, "commit", h.commit(Commit{User: user, ID: "report"}).Status, StatusCommitted)
	wantStatus(t, "a new key on a closed hold", h.consume(Consume{User: user, ID: "report", Amount: 1, Key: "chunk-2"}).Status, StatusClosed)
	wantStatus(t, "an applied key after close", h.consume(Consume{User: user, ID: "report", Amount: 300, Key: "chunk-1"}).Status, StatusExists)
}

func TestCommit(t *testing.T) {
	ctx := testContext(t, 20*time.Second)
	h := newOps(t, ctx, testClient)
	user := unique("commit")
	h.reserve(Reserve{User: user, Meter: "analysis", Amount: 10, ID: "a"})

	committed := h.commit(Commit{User: user, ID: "a", Amount: Int64(7), Ref: "done"})
	wantStatus(t, "commit", committed.Status, StatusCommitted)
	if committed.Ref != "done" || committed.Hold.State != HoldCommitted || committed.Hold.Consumed != 7 {
		t.Fatalf("committed result: %+v hold %+v", committed.Outcome, *committed.Hold)
	}
	if committed.Meter.Used != 7 || committed.Meter.Reserved != 0 {
		t.Fatalf("the work's usage becomes exactly 7, the rest returned: %+v", *committed.Meter)
	}
	again := h.commit(Commit{User: user, ID: "a", Amount: Int64(7)})
	wantStatus(t, "commit again", again.Status, StatusExists)
	if again.Meter.Used != 7 {
		t.Fatalf("nothing charged twice: used %d", again.Meter.Used)
	}
	wantStatus(t, "unknown hold", h.commit(Commit{User: user, ID: "nope"}).Status, StatusNotFound)

	h.reserve(Reserve{User: user, Meter: "analysis", Amount: 5, ID: "b"})
	wantStatus(t, "release", h.release(Release{User: user, ID: "b"}).Status, StatusReleased)
	wantStatus(t, "commit a released hold", h.commit(Commit{User: user, ID: "b"}).Status, StatusClosed)

	h.reserve(Reserve{User: user, Meter: "analysis", Amount: 5, ID: "c"})
	byDefault := h.commit(Commit{User: user, ID: "c"})
	if byDefault.Hold.Consumed != 5 || byDefault.Meter.Used != 12 {
		t.Fatalf("commit without amount charges the hold's amount: hold %+v meter %+v", *byDefault.Hold, *byDefault.Meter)
	}
}

func TestRelease(t *testing.T) {
	ctx := testContext(t, 20*time.Second)
	h := newOps(t, ctx, testClient)
	user := unique("release")
	h.reserve(Reserve{User: user, Meter: "analysis", Amount: 10, ID: "a"})
	released := h.release(Release{User: user, ID: "a"})
	wantStatus(t, "release", released.Status, StatusReleased)
	if released.Hold.State != HoldReleased || released.Meter.Reserved != 0 || released.Meter.Used != 0 {
		t.Fatalf("release returns the hold: %+v %+v", *released.Hold, *released.Meter)
	}
	wantStatus(t, "release again", h.release(Release{User: user, ID: "a"}).Status, StatusExists)
	wantStatus(t, "unknown hold", h.release(Release{User: user, ID: "nope"}).Status, StatusNotFound)
	h.reserve(Reserve{User: user, Meter: "analysis", Amount: 10, ID: "b"})
	h.commit(Commit{User: user, ID: "b"})
	wantStatus(t, "release a committed hold", h.release(Release{User: user, ID: "b"}).Status, StatusClosed)
}

func TestExtend(t *testing.T) {
	ctx := testContext(t, 20*time.Second)
	h := newOps(t, ctx, testClient)
	user := unique("extend")
	reserved := h.reserve(Reserve{User: user, Meter: "analysis", Amount: 1, ID: "a", TTL: time.Minute})
	extended := h.extend(Extend{User: user, ID: "a", TTL: 2 * time.Hour})
	wantStatus(t, "extend", extended.Status, StatusExtended)
	if !extended.Hold.ExpiresAt.After(reserved.Hold.ExpiresAt.Add(time.Hour)) {
		t.Fatalf("expiresAt %v not moved two hours out from %v", extended.Hold.ExpiresAt, reserved.Hold.ExpiresAt)
	}
	wantStatus(t, "ttl past a day", h.extend(Extend{User: user, ID: "a", TTL: 25 * time.Hour}).Status, StatusInvalidRequest)
	wantStatus(t, "unknown hold", h.extend(Extend{User: user, ID: "nope", TTL: time.Minute}).Status, StatusNotFound)
	h.release(Release{User: user, ID: "a"})
	wantStatus(t, "extend a released hold", h.extend(Extend{User: user, ID: "a", TTL: time.Minute}).Status, StatusClosed)
}

func TestAdjust(t *testing.T) {
	ctx := testContext(t, 20*time.Second)
	h := newOps(t, ctx, testClient)
	user := unique("adjust")
	charged := h.adjust(Adjust{User: user, Meter: "storage_bytes", Amount: 5000, ID: "upload-1"})
	wantStatus(t, "adjust", charged.Status, StatusAdjusted)
	if charged.Meter.Used != 5000 || charged.Meter.Meter != "storage_bytes" {
		t.Fatalf("adjust charges directly: %+v", *charged.Meter)
	}
	again := h.adjust(Adjust{User: user, Meter: "storage_bytes", Amount: 5000, ID: "upload-1"})
	wantStatus(t, "the same adjust again", again.Status, StatusExists)
	if again.Meter.Used != 5000 {
		t.Fatalf("nothing applied twice: used %d", again.Meter.Used)
	}
	wantStatus(t, "same id, other amount", h.adjust(Adjust{User: user, Meter: "storage_bytes", Amount: 1, ID: "upload-1"}).Status, StatusConflict)
	wantStatus(t, "unknown meter", h.adjust(Adjust{User: user, Meter: "no_such_meter", Amount: 1, ID: "x"}).Status, StatusUnknownMeter)
	refund := h.adjust(Adjust{User: user, Meter: "storage_bytes", Amount: -9000, ID: "delete-1"})
	wantStatus(t, "refund", refund.Status, StatusAdjusted)
	if refund.Meter.Used != 0 {
		t.Fatalf("a refund never takes usage below 0: used %d", refund.Meter.Used)
	}
}

func TestSlots(t *testing.T) {
	ctx := testContext(t, 30*time.Second)
	h := newOps(t, ctx, testClient)
	c := testClient
	user := unique("slots") // free plan: 1 slot

	first := h.acquireSlot(AcquireSlot{User: user, Job: "job-1", Lease: 30 * time.Second, Ref: "s1"})
	wantStatus(t, "acquire", first.Status, StatusAcquired)
	if !first.Granted() || first.Ref != "s1" || first.Limit == nil || *first.Limit != 1 || first.Held != 1 {
		t.Fatalf("acquired result: %+v", first)
	}
	if until := time.Until(first.LeaseExpiresAt); until < 25*time.Second || until > 35*time.Second {
		t.Fatalf("leaseExpiresAt %v not about 30s away", first.LeaseExpiresAt)
	}
	wantStatus(t, "acquire again", h.acquireSlot(AcquireSlot{User: user, Job: "job-1"}).Status, StatusExists)

	busy := h.acquireSlot(AcquireSlot{User: user, Job: "job-2"})
	wantStatus(t, "a second job of a free user", busy.Status, StatusBusy)
	if busy.Granted() || busy.RetryAfter < testSnoozeBase || busy.RetryAfter > testSnoozeBase+testSnoozeJitter {
		t.Fatalf("busy's retryAfter %v is not the snooze base %v plus up to %v jitter", busy.RetryAfter, testSnoozeBase, testSnoozeJitter)
	}

	renewed := h.renewSlot(RenewSlot{User: user, Job: "job-1", Lease: time.Minute})
	wantStatus(t, "renew", renewed.Status, StatusRenewed)
	wantStatus(t, "renew a job without a slot", h.renewSlot(RenewSlot{User: user, Job: "job-2"}).Status, StatusNotFound)

	// A waiter gets the slot when it is released.
	waited := make(chan SlotResult, 1)
	go func() {
		r, err := c.AcquireSlot(ctx, AcquireSlot{User: user, Job: "job-3", Wait: 10 * time.Second})
		if err != nil {
			t.Error(err)
		}
		waited <- r
	}()
	time.Sleep(300 * time.Millisecond)
	released := h.releaseSlot(ReleaseSlot{User: user, Job: "job-1"})
	wantStatus(t, "release", released.Status, StatusReleased)
	select {
	case r := <-waited:
		wantStatus(t, "the waiter", r.Status, StatusAcquired)
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter did not get the released slot")
	}
	wantStatus(t, "release again", h.releaseSlot(ReleaseSlot{User: user, Job: "job-1"}).Status, StatusNotFound)
	h.releaseSlot(ReleaseSlot{User: user, Job: "job-3"})

	system := h.acquireSlot(AcquireSlot{User: "", Job: "nightly"})
	wantStatus(t, "a system job", system.Status, StatusAcquired)
	if system.Limit != nil || system.Held != 0 {
		t.Fatalf("a system job counts against nothing: limit %v held %d", system.Limit, system.Held)
	}
	wantStatus(t, "renew a system job", h.renewSlot(RenewSlot{User: "", Job: "nightly"}).Status, StatusNotFound)
	wantStatus(t, "lease too short", h.acquireSlot(AcquireSlot{User: user, Job: "job-4", Lease: 10 * time.Millisecond}).Status, StatusInvalidRequest)
}

func TestGetUsage(t *testing.T) {
	ctx := testContext(t, 20*time.Second)
	h := newOps(t, ctx, testClient)
	c := testClient
	user := unique("usage")
	h.reserve(Reserve{User: user, Meter: "tokens", Amount: 1000, ID: "a"})
	h.acquireSlot(AcquireSlot{User: user, Job: "job-1"})

	for name, get := range map[string]func() (UsageResult, error){
		"ops":   func() (UsageResult, error) { return c.GetUsage(ctx, GetUsage{User: user, Ref: "u"}) },
		"admin": func() (UsageResult, error) { return c.Admin().GetUsage(ctx, GetUsage{User: user, Ref: "u"}) },
	} {
		usage, err := get()
		if err != nil {
			t.Fatal(err)
		}
		wantStatus(t, name, usage.Status, StatusOK)
		if usage.Plan != "free" || usage.Ref != "u" {
			t.Fatalf("%s: plan %q ref %q", name, usage.Plan, usage.Ref)
		}
		var names []string
		for _, m := range usage.Meters {
			names = append(names, m.Meter)
		}
		if len(names) != 4 || names[0] != "analysis" || names[1] != "specview" || names[2] != "tokens" || names[3] != "storage_bytes" {
			t.Fatalf("%s: meters in configuration order, got %v", name, names)
		}
		tokens, _ := usage.Meter("tokens")
		if tokens.Limit != 400000 || tokens.Reserved != 1000 || tokens.PendingHolds != 1 || tokens.Period != PeriodMonth || tokens.PeriodStart == nil {
			t.Fatalf("%s: tokens %+v", name, tokens)
		}
		if storage, _ := usage.Meter("storage_bytes"); storage.Period != PeriodNone || storage.PeriodStart != nil {
			t.Fatalf("%s: a gauge has no period start: %+v", name, storage)
		}
		if usage.Slots.Limit == nil || *usage.Slots.Limit != 1 || usage.Slots.Held != 1 || len(usage.Slots.Jobs) != 1 || usage.Slots.Jobs[0].Job != "job-1" {
			t.Fatalf("%s: slots %+v", name, usage.Slots)
		}
	}
}

func TestSetPlan(t *testing.T) {
	ctx := testContext(t, 20*time.Second)
	h := newOps(t, ctx, testClient)
	user := unique("plan")
	wantStatus(t, "set_plan", h.setPlan(SetPlan{User: user, Plan: "pro"}).Status, StatusOK)
	usage := h.getUsage(GetUsage{User: user})
	analysis, _ := usage.Meter("analysis")
	if usage.Plan != "pro" || analysis.Limit != 50000 || *usage.Slots.Limit != 3 {
		t.Fatalf("after set_plan pro: plan %q analysis limit %d slots %v", usage.Plan, analysis.Limit, *usage.Slots.Limit)
	}
	wantStatus(t, "unknown plan", h.setPlan(SetPlan{User: user, Plan: "gold"}).Status, StatusUnknownPlan)
}

func TestSetLimit(t *testing.T) {
	ctx := testContext(t, 20*time.Second)
	h := newOps(t, ctx, testClient)
	user := unique("limit")
	wantStatus(t, "set_limit", h.setLimit(SetLimit{User: user, Meter: "analysis", Limit: Int64(42)}).Status, StatusOK)
	if m := meterOf(t, user, "analysis"); m.Limit != 42 {
		t.Fatalf("limit %d after set_limit 42", m.Limit)
	}
	wantStatus(t, "back to the default", h.setLimit(SetLimit{User: user, Meter: "analysis", Limit: nil}).Status, StatusOK)
	if m := meterOf(t, user, "analysis"); m.Limit != 5000 {
		t.Fatalf("limit %d after set_limit null, want the free plan's 5000", m.Limit)
	}
	wantStatus(t, "unknown meter", h.setLimit(SetLimit{User: user, Meter: "no_such_meter", Limit: Int64(1)}).Status, StatusUnknownMeter)
}

func TestListHolds(t *testing.T) {
	ctx := testContext(t, 20*time.Second)
	h := newOps(t, ctx, testClient)
	user := unique("holds")
	for _, id := range []string{"h1", "h2", "h3"} {
		h.reserve(Reserve{User: user, Meter: "analysis", Amount: 2, ID: id})
		time.Sleep(2 * time.Millisecond) // distinct createdAt: oldest first is then h1, h2, h3
	}
	h.commit(Commit{User: user, ID: "h1", Amount: Int64(1)})

	pending := h.listHolds(ListHolds{User: user})
	wantStatus(t, "list_holds", pending.Status, StatusOK)
	if len(pending.Holds) != 2 || pending.Holds[0].ID != "h2" || pending.Holds[1].ID != "h3" || pending.More {
		t.Fatalf("pending holds, oldest first: %+v more %v", pending.Holds, pending.More)
	}
	if h := pending.Holds[0]; h.Meter != "analysis" || h.Amount != 2 || h.State != HoldPending || h.CreatedAt.IsZero() || h.ExpiresAt.Before(h.CreatedAt) {
		t.Fatalf("listed hold %+v", h)
	}
	first := h.listHolds(ListHolds{User: user, State: HoldsAll, Limit: 1})
	if len(first.Holds) != 1 || first.Holds[0].ID != "h1" || !first.More {
		t.Fatalf("limit 1 of all: %+v more %v", first.Holds, first.More)
	}
	closed := h.listHolds(ListHolds{User: user, State: HoldsClosed})
	if len(closed.Holds) != 1 || closed.Holds[0].State != HoldCommitted || closed.Holds[0].Consumed != 1 {
		t.Fatalf("closed holds: %+v", closed.Holds)
	}
	wantStatus(t, "limit past 1000", h.listHolds(ListHolds{User: user, Limit: 1001}).Status, StatusInvalidRequest)
}

// A client configured with another partition count than the coordinator's sends some users to the
// wrong partition: the coordinator says so, and that is a result too.
func TestWrongPartition(t *testing.T) {
	ctx := testContext(t, 20*time.Second)
	h := newOps(t, ctx, testClient)
	// 17, not a multiple of 16: a user in partition p < 16 of 17 is in another partition of 16.
	wrong, err := New(testNC, Options{Prefix: testPrefix, Partitions: 17})
	if err != nil {
		t.Fatal(err)
	}
	defer wrong.Close()
	user := ""
	for user == "" {
		candidate := unique("wrong")
		if p17 := Partition(candidate, 17); p17 < testPartitions && p17 != Partition(candidate, testPartitions) {
			user = candidate
		}
	}
	r := newOps(t, ctx, wrong).reserve(Reserve{User: user, Meter: "analysis", Amount: 1, ID: "a"})
	wantStatus(t, "a user sent to another partition", r.Status, StatusWrongPartition)
	right := h.reserve(Reserve{User: user, Meter: "analysis", Amount: 1, ID: "a"})
	wantStatus(t, "the same user to its partition", right.Status, StatusReserved)
}
