package quota

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// Retries use the time they are given (issue 30 item 4): a call against a deployment nobody answers
// ends at its deadline, not when its next backoff would pass it. The attempts keep the default policy
// (50ms doubling to 2s), the one whose early give-up the issue measured.
func TestRetriesUseTheWholeDeadline(t *testing.T) {
	silentPrefix, _ := fakeCoordinator(t, func(*nats.Msg) {}) // receives, never answers
	cases := []struct {
		name     string
		prefix   string
		timeout  time.Duration // the context's deadline; zero: none, CallTimeout bounds the call
		call     time.Duration
		request  time.Duration
		deadline time.Duration
	}{
		{"no responders, 500ms context", "tgonobody" + randomHex(4), 500 * time.Millisecond, 0, 0, 500 * time.Millisecond},
		{"no responders, 800ms CallTimeout", "tgonobody" + randomHex(4), 0, 800 * time.Millisecond, 0, 800 * time.Millisecond},
		{"no answer, 500ms context", silentPrefix, 500 * time.Millisecond, 0, 150 * time.Millisecond, 500 * time.Millisecond},
		{"no answer, 800ms CallTimeout", silentPrefix, 0, 800 * time.Millisecond, 150 * time.Millisecond, 800 * time.Millisecond},
	}
	for _, tc := range cases {
		tc := tc
		t.Run(tc.name, func(t *testing.T) {
			options := testOptions()
			options.Prefix = tc.prefix
			options.CallTimeout = tc.call
			if tc.request > 0 {
				options.RequestTimeout = tc.request
			}
			c, err := New(testNC, options)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(c.Close)
			ctx := context.Background()
			if tc.timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.timeout)
				defer cancel()
			}
			started := time.Now()
			_, err = c.Reserve(ctx, Reserve{User: "u", Meter: "analysis", Amount: 1, ID: "job"})
			elapsed := time.Since(started)
			t.Logf("%s: error after %v (%d attempts): %v", tc.name, elapsed.Round(time.Millisecond), c.Stats().Retries+1, err)
			var exhausted *RetriesExhaustedError
			if !errors.As(err, &exhausted) || !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("want retries exhausted at the deadline, got %v", err)
			}
			// The deadline itself, less a scheduling margin; never more than a little past it.
			if elapsed < tc.deadline-30*time.Millisecond || elapsed > tc.deadline+300*time.Millisecond {
				t.Fatalf("the call ended after %v of its %v", elapsed, tc.deadline)
			}
		})
	}
}
