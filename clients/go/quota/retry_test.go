package quota

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// proxy stands between a client and the coordinator: it serves {its prefix}.v1.*.ops|admin and
// forwards each message to the coordinator's subject of the same partition, so a test can make one
// message fail (answer unavailable although the coordinator decided it, or not answer at all) and
// see what the client does next.
type proxy struct {
	t      *testing.T
	prefix string
	// act decides what happens to the n-th message (from 1).
	act func(n int) proxyAction
	sub *nats.Subscription

	mu     sync.Mutex
	bodies [][]byte
}

type proxyAction int

const (
	relay                    proxyAction = iota // forward, answer what the coordinator answered
	forwardAnswerUnavailable                    // forward (it takes effect), answer unavailable to every command
	drop                                        // neither forward nor answer: the client's request times out
)

func startProxy(t *testing.T, prefix string, act func(n int) proxyAction) *proxy {
	p := &proxy{t: t, prefix: prefix, act: act}
	if err := p.listen(); err != nil {
		t.Fatal(err)
	}
	return p
}

// listen subscribes the proxy (on any goroutine); the test's cleanup unsubscribes it.
func (p *proxy) listen() error {
	sub, err := testNC.Subscribe(p.prefix+".v1.*.*", p.handle)
	if err != nil {
		return err
	}
	p.sub = sub
	p.t.Cleanup(func() { _ = sub.Unsubscribe() })
	return testNC.Flush()
}

func (p *proxy) handle(msg *nats.Msg) {
	p.mu.Lock()
	p.bodies = append(p.bodies, append([]byte(nil), msg.Data...))
	n := len(p.bodies)
	p.mu.Unlock()
	action := p.act(n)
	if action == drop {
		return
	}
	target := testPrefix + strings.TrimPrefix(msg.Subject, p.prefix)
	reply, err := testNC.Request(target, msg.Data, 5*time.Second)
	if err != nil {
		p.t.Errorf("proxy: forwarding to %s: %v", target, err)
		return
	}
	if action == forwardAnswerUnavailable {
		var commands []json.RawMessage
		_ = json.Unmarshal(msg.Data, &commands)
		unavailable := make([]map[string]string, len(commands))
		for i := range unavailable {
			unavailable[i] = map[string]string{"status": "unavailable"}
		}
		data, _ := json.Marshal(unavailable)
		_ = msg.Respond(data)
		return
	}
	_ = msg.RespondMsg(&nats.Msg{Data: reply.Data, Header: reply.Header})
}

func (p *proxy) received() [][]byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([][]byte(nil), p.bodies...)
}

func clientWithPrefix(t *testing.T, prefix string, tweak func(*Options)) *Client {
	options := testOptions()
	options.Prefix = prefix
	options.Retry = RetryPolicy{BaseDelay: 10 * time.Millisecond, MaxDelay: 100 * time.Millisecond}
	if tweak != nil {
		tweak(&options)
	}
	c, err := New(testNC, options)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func sameBodies(t *testing.T, bodies [][]byte, want int) {
	t.Helper()
	if len(bodies) != want {
		t.Fatalf("the proxy received %d messages, want %d: %q", len(bodies), want, bodies)
	}
	for _, body := range bodies[1:] {
		if !bytes.Equal(body, bodies[0]) {
			t.Fatalf("a retry is not the same command: %s then %s", bodies[0], body)
		}
	}
}

// PROTOCOL.md: unavailable means nothing is granted by this reply, though it may have taken effect;
// retry the same command, and the retry's result says what stands.
func TestRetryAfterUnavailableAnsweredExistsCountedOnce(t *testing.T) {
	ctx := testContext(t, 20*time.Second)
	user := unique("unavailable")
	p := startProxy(t, "tgoproxy"+randomHex(4), func(n int) proxyAction {
		if n == 1 {
			return forwardAnswerUnavailable
		}
		return relay
	})
	c := clientWithPrefix(t, p.prefix, nil)

	r, err := c.Reserve(ctx, Reserve{User: user, Meter: "analysis", Amount: 10, ID: "job-1"})
	if err != nil {
		t.Fatal(err)
	}
	wantStatus(t, "the retried reserve", r.Status, StatusExists)
	sameBodies(t, p.received(), 2)
	if c.Stats().Retries != 1 {
		t.Fatalf("retries %d, want 1", c.Stats().Retries)
	}
	if m := meterOf(t, user, "analysis"); m.Reserved != 10 || m.PendingHolds != 1 {
		t.Fatalf("the hold must be counted once: reserved %d in %d holds", m.Reserved, m.PendingHolds)
	}
}

func TestRetryOfCommitAfterUnavailableChargesOnce(t *testing.T) {
	ctx := testContext(t, 20*time.Second)
	user := unique("unavailable-commit")
	wantStatus(t, "reserve", newOps(t, ctx, testClient).reserve(Reserve{User: user, Meter: "tokens", Amount: 100, ID: "job"}).Status, StatusReserved)
	p := startProxy(t, "tgoproxy"+randomHex(4), func(n int) proxyAction {
		if n == 1 {
			return forwardAnswerUnavailable
		}
		return relay
	})
	c := clientWithPrefix(t, p.prefix, nil)
	r, err := c.Commit(ctx, Commit{User: user, ID: "job", Amount: Int64(70)})
	if err != nil {
		t.Fatal(err)
	}
	wantStatus(t, "the retried commit", r.Status, StatusExists)
	sameBodies(t, p.received(), 2)
	if m := meterOf(t, user, "tokens"); m.Used != 70 || m.Reserved != 0 {
		t.Fatalf("used %d reserved %d, want 70 charged once", m.Used, m.Reserved)
	}
}

// No responders: no coordinator owns the partition right now; retry with backoff.
func TestRetryNoRespondersUntilACoordinatorAnswers(t *testing.T) {
	ctx := testContext(t, 20*time.Second)
	prefix := "tgoproxy" + randomHex(4)
	c := clientWithPrefix(t, prefix, nil)
	late := &proxy{t: t, prefix: prefix, act: func(int) proxyAction { return relay }}
	go func() {
		time.Sleep(300 * time.Millisecond)
		if err := late.listen(); err != nil {
			t.Error(err)
		}
	}()
	r, err := c.Reserve(ctx, Reserve{User: unique("noresponders"), Meter: "analysis", Amount: 1, ID: "job"})
	if err != nil {
		t.Fatal(err)
	}
	wantStatus(t, "reserve once a coordinator answers", r.Status, StatusReserved)
	if c.Stats().Retries < 1 {
		t.Fatal("no retry counted")
	}
}

func TestRetriesEndAtTheContextDeadline(t *testing.T) {
	c := clientWithPrefix(t, "tgonobody"+randomHex(4), nil)
	ctx, cancel := context.WithTimeout(context.Background(), 400*time.Millisecond)
	defer cancel()
	started := time.Now()
	_, err := c.Reserve(ctx, Reserve{User: "u", Meter: "analysis", Amount: 1, ID: "job"})
	var exhausted *RetriesExhaustedError
	if !errors.As(err, &exhausted) || exhausted.Reason != RetryNoResponders || exhausted.Attempts < 2 {
		t.Fatalf("want retries of no responders exhausted, got %v", err)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the error should wrap the deadline: %v", err)
	}
	if elapsed := time.Since(started); elapsed > time.Second {
		t.Fatalf("retries went on %v past a 400ms deadline", elapsed)
	}
}

func TestRetryAfterTimeoutSendsTheSameCommand(t *testing.T) {
	ctx := testContext(t, 20*time.Second)
	p := startProxy(t, "tgoproxy"+randomHex(4), func(n int) proxyAction {
		if n == 1 {
			return drop
		}
		return relay
	})
	c := clientWithPrefix(t, p.prefix, func(o *Options) { o.RequestTimeout = 200 * time.Millisecond })
	r, err := c.AcquireSlot(ctx, AcquireSlot{User: unique("timeout"), Job: "job"})
	if err != nil {
		t.Fatal(err)
	}
	wantStatus(t, "acquire after a timed-out message", r.Status, StatusAcquired)
	sameBodies(t, p.received(), 2)
}

// fakeCoordinator answers every message with reply, for answers the coordinator under test does not
// give on demand.
func fakeCoordinator(t *testing.T, reply func(msg *nats.Msg)) (prefix string, received func() int) {
	prefix = "tgofake" + randomHex(4)
	var mu sync.Mutex
	count := 0
	sub, err := testNC.Subscribe(prefix+".v1.*.*", func(msg *nats.Msg) {
		mu.Lock()
		count++
		mu.Unlock()
		reply(msg)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := testNC.Flush(); err != nil {
		t.Fatal(err)
	}
	return prefix, func() int { mu.Lock(); defer mu.Unlock(); return count }
}

// Revision 1.2's limit_reached is a typed result, not retried (the same command gets the same answer).
// The coordinator on this branch implements revision 1.1, so a fake answers it here.
func TestLimitReachedIsATypedResultNotRetried(t *testing.T) {
	ctx := testContext(t, 10*time.Second)
	prefix, received := fakeCoordinator(t, func(msg *nats.Msg) {
		_ = msg.Respond([]byte(`[{"status":"limit_reached","bound":"pending_holds","max":10000,"ref":"r9"}]`))
	})
	c := clientWithPrefix(t, prefix, nil)
	r, err := c.Reserve(ctx, Reserve{User: "u", Meter: "analysis", Amount: 1, ID: "job", Ref: "r9"})
	if err != nil {
		t.Fatal(err)
	}
	wantStatus(t, "reserve", r.Status, StatusLimitReached)
	if r.LimitReached == nil || *r.LimitReached != (LimitReached{Bound: BoundPendingHolds, Max: 10000}) || r.Ref != "r9" || r.Granted() {
		t.Fatalf("limit_reached result: %+v", r)
	}
	if received() != 1 || c.Stats().Retries != 0 {
		t.Fatalf("limit_reached was retried: %d messages", received())
	}
	_, err = WithHold(ctx, c, Reserve{User: "u", Meter: "analysis", Amount: 1, ID: "job"}, func(context.Context, ReserveResult) (int64, error) {
		t.Fatal("the work ran without a hold")
		return 0, nil
	})
	var notGranted *HoldNotGrantedError
	if !errors.As(err, &notGranted) || notGranted.Result.LimitReached == nil || notGranted.Result.LimitReached.Bound != BoundPendingHolds {
		t.Fatalf("WithHold: want a HoldNotGrantedError carrying limit_reached, got %v", err)
	}
	slot, err := c.AcquireSlot(ctx, AcquireSlot{User: "u", Job: "j"})
	if err != nil || slot.Status != StatusLimitReached || slot.LimitReached.Max != 10000 {
		t.Fatalf("acquire_slot limit_reached: %+v %v", slot, err)
	}
}

// limit_reached from WithHold and WithSlot is a *LimitReachedError a worker finds with errors.As (issue
// 30 item 2), and every refusal's message names the user, the hold or job, and the reply's figures
// (item 3).
func TestLimitReachedFromTheHelpersIsTypedAndSaysWhatHappened(t *testing.T) {
	ctx := testContext(t, 10*time.Second)
	prefix, _ := fakeCoordinator(t, func(msg *nats.Msg) {
		_ = msg.Respond([]byte(`[{"status":"limit_reached","bound":"slot_waiters","max":1000}]`))
	})
	c := clientWithPrefix(t, prefix, nil)
	_, holdErr := WithHold(ctx, c, Reserve{User: "acct-42", Meter: "tokens", Amount: 350000, ID: "job-7"}, func(context.Context, ReserveResult) (int64, error) {
		return 0, errors.New("ran without a hold")
	})
	slotErr := WithSlot(ctx, c, SlotJob{User: "acct-42", Job: "job-8"}, func(context.Context) error { return errors.New("ran without a slot") })
	for _, tc := range []struct {
		err  error
		want []string
	}{
		{holdErr, []string{`hold "job-7"`, `user "acct-42"`, "350000 tokens", "limit_reached", "slot_waiters", "1000"}},
		{slotErr, []string{`job "job-8"`, `user "acct-42"`, "limit_reached", "slot_waiters", "1000"}},
	} {
		var limit *LimitReachedError
		if !errors.As(tc.err, &limit) || limit.Bound != BoundSlotWaiters || limit.Max != 1000 || limit.User != "acct-42" {
			t.Fatalf("want a *LimitReachedError (slot_waiters, 1000, user acct-42), got %T %v", tc.err, tc.err)
		}
		for _, part := range tc.want {
			if !strings.Contains(tc.err.Error(), part) {
				t.Errorf("the message %q does not say %s", tc.err.Error(), part)
			}
		}
		t.Logf("%s", tc.err)
	}
	var notGranted *SlotNotGrantedError
	if !errors.As(slotErr, &notGranted) || notGranted.Job != "job-8" {
		t.Fatalf("WithSlot: want a *SlotNotGrantedError as well, got %v", slotErr)
	}
}

// An insufficient_quota refusal names the figures of the meter it was refused on.
func TestHoldNotGrantedSaysTheFigures(t *testing.T) {
	ctx := testContext(t, 10*time.Second)
	user := unique("figures")
	setLimit(t, user, "tokens", 100)
	_, err := WithHold(ctx, testClient, Reserve{User: user, Meter: "tokens", Amount: 350, ID: "job-9"}, func(context.Context, ReserveResult) (int64, error) {
		return 0, errors.New("ran without a hold")
	})
	t.Logf("%s", err)
	for _, part := range []string{`hold "job-9"`, "user \"" + user + "\"", "insufficient_quota", "requested 350", "available 100 of limit 100"} {
		if err == nil || !strings.Contains(err.Error(), part) {
			t.Errorf("the message %v does not say %s", err, part)
		}
	}
}

func TestServiceErrorIsAnErrorNotRetried(t *testing.T) {
	ctx := testContext(t, 10*time.Second)
	prefix, received := fakeCoordinator(t, func(msg *nats.Msg) {
		reply := nats.NewMsg(msg.Reply)
		reply.Header.Set("Nats-Service-Error-Code", "400")
		reply.Header.Set("Nats-Service-Error", "batch of 1001 commands, at most 1000")
		_ = msg.RespondMsg(reply)
	})
	c := clientWithPrefix(t, prefix, nil)
	_, err := c.GetUsage(ctx, GetUsage{User: "u"})
	var service *ServiceError
	if !errors.As(err, &service) || service.Code != 400 || !strings.Contains(service.Description, "1001") {
		t.Fatalf("want a ServiceError 400, got %v", err)
	}
	if received() != 1 {
		t.Fatalf("a service error was retried: %d messages", received())
	}
}

func TestABrokenReplyIsATransportError(t *testing.T) {
	ctx := testContext(t, 10*time.Second)
	prefix, _ := fakeCoordinator(t, func(msg *nats.Msg) {
		_ = msg.Respond([]byte(`[{"status":"ok"},{"status":"ok"}]`)) // two results for one command
	})
	c := clientWithPrefix(t, prefix, nil)
	_, err := c.GetUsage(ctx, GetUsage{User: "u"})
	var transport *TransportError
	if !errors.As(err, &transport) {
		t.Fatalf("want a TransportError, got %v", err)
	}
}
