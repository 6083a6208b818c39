//go:build river_example

// Package river stands in for the parts of github.com/riverqueue/river the README's worker uses, with
// River's names and signatures, so that the worker compiles here: River is not in Debian and needs a
// newer Go than Debian's. A project with River imports the real package instead.
package river

import (
	"context"
	"time"
)

// JobArgs is a job's arguments: its kind names the worker.
type JobArgs interface{ Kind() string }

// JobRow is a job as River stores it (rivertype.JobRow), the fields the worker reads.
type JobRow struct {
	ID      int64
	Attempt int
}

// Job is a job with its decoded arguments.
type Job[T JobArgs] struct {
	*JobRow
	Args T
}

// Worker works jobs of one kind.
type Worker[T JobArgs] interface {
	Work(ctx context.Context, job *Job[T]) error
}

// WorkerDefaults gives a worker River's defaults for the rest of the Worker interface.
type WorkerDefaults[T JobArgs] struct{}

// JobSnooze: the job runs again after duration, not counted as a failed attempt.
func JobSnooze(duration time.Duration) error { return &snoozeError{duration: duration} }

// JobCancel: the job is not retried; err is recorded.
func JobCancel(err error) error { return &cancelError{err: err} }

// Workers is the registry of workers a River client runs.
type Workers struct{ kinds map[string]any }

// NewWorkers returns an empty registry.
func NewWorkers() *Workers { return &Workers{kinds: map[string]any{}} }

// AddWorker registers worker for its jobs' kind.
func AddWorker[T JobArgs](workers *Workers, worker Worker[T]) {
	var args T
	workers.kinds[args.Kind()] = worker
}

type snoozeError struct{ duration time.Duration }

func (e *snoozeError) Error() string { return "snooze " + e.duration.String() }

type cancelError struct{ err error }

func (e *cancelError) Error() string { return "cancel: " + e.err.Error() }

func (e *cancelError) Unwrap() error { return e.err }
