// Package quota is the Go client of quota-coordinator: holds (reservations of usage quota) and
// fairness slots per user, decided by the coordinator over NATS request/reply as the wire protocol
// (docs/PROTOCOL.md, revision 1.2) says.
//
// Every operation is a typed method taking a context.Context. A refusal (insufficient_quota, busy,
// closed, limit_reached, ...) is a result with its Status, never an error: errors are for what the
// call could not find out (the coordinator unreachable past the deadline, a broken reply, a closed
// client). Commands are routed to their user's partition (FNV-1a, as the coordinator computes it),
// coalesced with concurrent commands of the same partition into one batch message while a message of
// that partition is in flight, and retried with backoff when the protocol says a retry is safe
// (unavailable, overloaded, no responders, a timed-out message): the retry re-sends the same bytes, so
// the same id/job/key, and the coordinator answers a repeat with exists rather than granting twice.
//
//	nc, _ := nats.Connect(url, opts...)          // or quota.Connect, which reads NATS_* itself
//	c, _ := quota.New(nc, quota.Options{})
//	r, err := c.Reserve(ctx, quota.Reserve{User: "acct-42", Meter: "tokens", Amount: 350_000, ID: "job-7"})
//	if err != nil { ... }                          // could not find out
//	switch r.Status {
//	case quota.StatusReserved, quota.StatusExists:  // granted
//	case quota.StatusInsufficientQuota:              // r.Insufficient.PendingHolds > 0: work in progress
//	}
//
// WithHold and WithSlot run work under a hold or in a slot; a full user's WithSlot returns a
// *SlotBusyError whose RetryAfter a River worker hands to river.JobSnooze, and limit_reached is a
// *LimitReachedError (errors.As) the worker gives up on. A wait whose context ends is withdrawn, so it
// never takes a slot afterwards. Connect reads NATS_*, QUOTA_PREFIX and QUOTA_PARTITIONS and checks
// them against the running coordinators ($SRV.INFO). Events reads the coordinator's events stream
// through a JetStream consumer. clients/go/README.md says how to install it offline.
package quota
