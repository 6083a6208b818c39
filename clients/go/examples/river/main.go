//go:build river_example

// The README's River worker ("From Go" in clients/go/README.md), compiled against River's interfaces
// stubbed in ./river: `go vet -tags river_example ./examples/river/...` (scripts/test.sh) checks that it
// compiles, and scripts/test.sh that the README shows the same code from `type AnalysisArgs` on.
package main

import (
	"context"
	"errors"
	"log"
	"strconv"
	"time"

	"github.com/quota-coordinator/quota-coordinator/clients/go/examples/river/river"
	"github.com/quota-coordinator/quota-coordinator/clients/go/quota"
)

func main() {
	client, err := quota.Connect(quota.Options{}) // NATS_*, QUOTA_PREFIX, QUOTA_PARTITIONS; checked with the service
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	workers := river.NewWorkers()
	river.AddWorker[AnalysisArgs](workers, &AnalysisWorker{Quota: client})
}

func runAnalysis(ctx context.Context, args AnalysisArgs) (int64, error) {
	return 120_000, ctx.Err()
}

// README begin
type AnalysisArgs struct {
	UserID string `json:"user_id"`
	Report string `json:"report"`
}

func (AnalysisArgs) Kind() string { return "analysis" }

type AnalysisWorker struct {
	river.WorkerDefaults[AnalysisArgs]
	Quota *quota.Client
}

func (w *AnalysisWorker) Work(ctx context.Context, job *river.Job[AnalysisArgs]) error {
	// The job's id names the slot and the hold: a retried job finds its own (`exists`), never a second one.
	id := strconv.FormatInt(job.ID, 10)
	slot := quota.SlotJob{User: job.Args.UserID, Job: id, Wait: 5 * time.Second}
	err := quota.WithSlot(ctx, w.Quota, slot, func(ctx context.Context) error {
		reserve := quota.Reserve{User: job.Args.UserID, Meter: "tokens", Amount: 350_000, ID: id}
		_, err := quota.WithHold(ctx, w.Quota, reserve, func(ctx context.Context, hold quota.ReserveResult) (int64, error) {
			return runAnalysis(ctx, job.Args) // the tokens it actually used: committed
		})
		return err
	})
	var busy *quota.SlotBusyError
	var limit *quota.LimitReachedError
	var refused *quota.HoldNotGrantedError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &busy):
		// Every slot of the user stayed taken: snooze for the coordinator's time, with its jitter.
		return river.JobSnooze(busy.RetryAfter)
	case errors.As(err, &limit):
		// A per-user bound (limit.Bound, limit.Max): the same job gets the same answer until the user's
		// other work ends; retrying on River's backoff would not help.
		return river.JobCancel(err)
	case errors.As(err, &refused) && refused.Result.Status == quota.StatusInsufficientQuota:
		// Out of quota for this month: retrying will not help.
		return river.JobCancel(err)
	default:
		// The coordinator could not be reached in time, the work failed, or another refusal: River
		// retries with its backoff, and the retry finds its own slot and hold.
		return err
	}
}

// README end
