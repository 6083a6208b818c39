package quota

import (
	"context"
	"testing"
)

// ops calls the client's operations for a test and fails the test on an error (a refusal is a
// result and is returned).
type ops struct {
	t   *testing.T
	ctx context.Context
	c   *Client
}

func newOps(t *testing.T, ctx context.Context, c *Client) ops { return ops{t: t, ctx: ctx, c: c} }

func (o ops) check(err error) {
	o.t.Helper()
	if err != nil {
		o.t.Fatal(err)
	}
}

func (o ops) reserve(in Reserve) ReserveResult {
	o.t.Helper()
	r, err := o.c.Reserve(o.ctx, in)
	o.check(err)
	return r
}

func (o ops) consume(in Consume) HoldResult {
	o.t.Helper()
	r, err := o.c.Consume(o.ctx, in)
	o.check(err)
	return r
}

func (o ops) commit(in Commit) HoldResult {
	o.t.Helper()
	r, err := o.c.Commit(o.ctx, in)
	o.check(err)
	return r
}

func (o ops) release(in Release) HoldResult {
	o.t.Helper()
	r, err := o.c.Release(o.ctx, in)
	o.check(err)
	return r
}

func (o ops) extend(in Extend) HoldResult {
	o.t.Helper()
	r, err := o.c.Extend(o.ctx, in)
	o.check(err)
	return r
}

func (o ops) adjust(in Adjust) AdjustResult {
	o.t.Helper()
	r, err := o.c.Adjust(o.ctx, in)
	o.check(err)
	return r
}

func (o ops) acquireSlot(in AcquireSlot) SlotResult {
	o.t.Helper()
	r, err := o.c.AcquireSlot(o.ctx, in)
	o.check(err)
	return r
}

func (o ops) renewSlot(in RenewSlot) SlotResult {
	o.t.Helper()
	r, err := o.c.RenewSlot(o.ctx, in)
	o.check(err)
	return r
}

func (o ops) releaseSlot(in ReleaseSlot) SlotResult {
	o.t.Helper()
	r, err := o.c.ReleaseSlot(o.ctx, in)
	o.check(err)
	return r
}

func (o ops) getUsage(in GetUsage) UsageResult {
	o.t.Helper()
	r, err := o.c.GetUsage(o.ctx, in)
	o.check(err)
	return r
}

func (o ops) setPlan(in SetPlan) AdminResult {
	o.t.Helper()
	r, err := o.c.Admin().SetPlan(o.ctx, in)
	o.check(err)
	return r
}

func (o ops) setLimit(in SetLimit) AdminResult {
	o.t.Helper()
	r, err := o.c.Admin().SetLimit(o.ctx, in)
	o.check(err)
	return r
}

func (o ops) listHolds(in ListHolds) ListHoldsResult {
	o.t.Helper()
	r, err := o.c.Admin().ListHolds(o.ctx, in)
	o.check(err)
	return r
}
