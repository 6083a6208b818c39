package quota_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/quota-coordinator/quota-coordinator/clients/go/quota"
)

func Example() {
	c, err := quota.Connect(quota.Options{}) // NATS_URL, NATS_CREDS, ... from the environment
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	hold, err := c.Reserve(ctx, quota.Reserve{User: "acct-42", Meter: "analysis", Amount: 1, ID: "job-9"})
	if err != nil {
		log.Fatal(err) // the outcome is unknown: retry later with the same ID
	}
	switch hold.Status {
	case quota.StatusReserved, quota.StatusExists:
		// run the work, then commit what it used
		_, err = c.Commit(ctx, quota.Commit{User: "acct-42", ID: "job-9", Amount: quota.Int64(1)})
	case quota.StatusInsufficientQuota:
		if hold.Insufficient.PendingHolds > 0 {
			fmt.Println("work in progress, try later")
		} else {
			fmt.Println("out of quota")
		}
	case quota.StatusLimitReached:
		fmt.Println("too much in flight:", hold.LimitReached.Bound, hold.LimitReached.Max)
	}
	if err != nil {
		log.Fatal(err)
	}
}

// The body of a River worker's Work method (README "From Go" shows it with River's types): a slot for
// the job, a hold for its tokens, and the snooze when the user's slots are full.
func ExampleWithSlot() {
	c, err := quota.Connect(quota.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	user, jobID := "acct-42", "river-job-1234"

	err = quota.WithSlot(ctx, c, quota.SlotJob{User: user, Job: jobID}, func(ctx context.Context) error {
		_, err := quota.WithHold(ctx, c, quota.Reserve{User: user, Meter: "tokens", Amount: 350_000, ID: jobID},
			func(ctx context.Context, hold quota.ReserveResult) (int64, error) {
				return 120_000, nil // the tokens the work actually used
			})
		return err
	})
	var busy *quota.SlotBusyError
	if errors.As(err, &busy) {
		fmt.Println("snooze for", busy.RetryAfter) // River: return river.JobSnooze(busy.RetryAfter)
	}
}
