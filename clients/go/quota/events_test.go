package quota

import (
	"context"
	"testing"
	"time"
)

// nextOf reads events until one of user's comes, acknowledging the others' (other tests' users).
func nextOf(t *testing.T, ctx context.Context, s *EventStream, user string) Event {
	t.Helper()
	for {
		delivery, err := s.Next(ctx)
		if err != nil {
			t.Fatalf("waiting for an event of %s: %v", user, err)
		}
		if err := delivery.Ack(); err != nil {
			t.Fatal(err)
		}
		if delivery.Event.User == user {
			return delivery.Event
		}
	}
}

func TestEventsDurableConsumerByKind(t *testing.T) {
	ctx := testContext(t, 40*time.Second)
	h := newOps(t, ctx, testClient)
	user := unique("events")
	durable := "go-test-" + randomHex(4)
	options := EventsOptions{Durable: durable, Kinds: []EventKind{EventPlanChanged, EventLimitChanged}, OnlyNew: true}
	stream, err := testClient.Events(ctx, options)
	if err != nil {
		t.Fatal(err)
	}
	if stream.Consumer != durable || stream.Stream != EventsStreamName(testPrefix) {
		t.Fatalf("consumer %q of %q", stream.Consumer, stream.Stream)
	}

	wantStatus(t, "set_plan", h.setPlan(SetPlan{User: user, Plan: "pro"}).Status, StatusOK)
	// Not asked for: a usage_threshold event (45 000 of pro's 50 000 crosses 0.8), which the consumer,
	// reading every kind on a NATS server before 2.10, acknowledges and skips.
	h.reserve(Reserve{User: user, Meter: "analysis", Amount: 1, ID: "a"})
	wantStatus(t, "commit past 0.8 of the limit", h.commit(Commit{User: user, ID: "a", Amount: Int64(45000)}).Status, StatusCommitted)
	wantStatus(t, "set_limit", h.setLimit(SetLimit{User: user, Meter: "analysis", Limit: Int64(7)}).Status, StatusOK)

	plan := nextOf(t, ctx, stream, user)
	if plan.Kind != EventPlanChanged || plan.Plan != "pro" || plan.PreviousPlan != "free" || plan.EventID == "" ||
		plan.Partition != Partition(user, testPartitions) || time.Since(plan.At) > time.Minute {
		t.Fatalf("plan_changed event: %+v", plan)
	}
	limit := nextOf(t, ctx, stream, user)
	if limit.Kind != EventLimitChanged || limit.Meter != "analysis" || limit.Limit == nil || *limit.Limit != 7 {
		t.Fatalf("limit_changed event: %+v", limit)
	}
	if err := stream.Stop(); err != nil {
		t.Fatal(err)
	}

	// The durable consumer keeps its place: a reader started again gets the next event, not the
	// acknowledged ones again.
	wantStatus(t, "set_limit back", h.setLimit(SetLimit{User: user, Meter: "analysis", Limit: nil}).Status, StatusOK)
	again, err := testClient.Events(ctx, options)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Stop()
	next := nextOf(t, ctx, again, user)
	if next.Kind != EventLimitChanged || next.Limit != nil || next.EventID == limit.EventID || next.EventID == plan.EventID {
		t.Fatalf("after a restart of the durable consumer: %+v", next)
	}
}

func TestEventsOfOneKind(t *testing.T) {
	ctx := testContext(t, 40*time.Second)
	h := newOps(t, ctx, testClient)
	user := unique("threshold")
	stream, err := testClient.Events(ctx, EventsOptions{Kinds: []EventKind{EventUsageThreshold}, OnlyNew: true})
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Stop()
	setLimit(t, user, "tokens", 100) // publishes limit_changed, which this consumer must not deliver
	h.reserve(Reserve{User: user, Meter: "tokens", Amount: 90, ID: "job"})
	wantStatus(t, "commit 85 of 100", h.commit(Commit{User: user, ID: "job", Amount: Int64(85)}).Status, StatusCommitted)

	crossed := nextOf(t, ctx, stream, user)
	if crossed.Kind != EventUsageThreshold || crossed.Meter != "tokens" || crossed.Threshold != 0.8 ||
		crossed.Limit == nil || *crossed.Limit != 100 || crossed.Used != 85 || crossed.PeriodStart == nil {
		t.Fatalf("usage_threshold event: %+v", crossed)
	}
}
