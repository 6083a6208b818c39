package quota

import (
	"encoding/json"
	"time"
)

// Outcome is what every result has: its Status, the command's Ref echoed back, and the fields of the
// answers any command may get.
type Outcome struct {
	Status Status
	// Ref is the command's ref, when it carried one.
	Ref string
	// Invalid is invalid_request's `error`: the field and what is wrong with it.
	Invalid string
	// LimitReached is set when Status is StatusLimitReached (PROTOCOL.md revision 1.2).
	LimitReached *LimitReached
}

// MeterState is a meter's state after a decision: Available is Limit - Used - Reserved; Overage is
// how far Used + Reserved stands over Limit (above 0 only after usage beyond holds, a lowered limit or
// a positive adjust).
type MeterState struct {
	Meter     string
	Limit     int64
	Used      int64
	Reserved  int64
	Available int64
	Overage   int64
}

// Hold is a hold as a result carries it. After commit, Consumed is the work's final usage.
type Hold struct {
	ID        string
	Amount    int64
	Consumed  int64
	State     HoldState
	ExpiresAt time.Time
}

// Insufficient is the body of insufficient_quota: PendingHolds > 0 means "work in progress" rather
// than "out of quota".
type Insufficient struct {
	Requested    int64
	PendingHolds int64
}

// ReserveResult answers Reserve: reserved, exists (the same pending hold, unchanged), conflict (the id
// is a pending hold of another meter or amount), closed (the id was already committed, released or
// expired), insufficient_quota, unknown_meter, or an answer any command may get.
type ReserveResult struct {
	Outcome
	// Meter: on every status but unknown_meter and the errors.
	Meter *MeterState
	// Hold: on reserved and exists (the hold), conflict and closed (the existing hold).
	Hold *Hold
	// Insufficient: on insufficient_quota.
	Insufficient *Insufficient
}

// Granted reports a hold to run work under: reserved, or exists (a retry of the same reserve).
func (r ReserveResult) Granted() bool {
	return r.Status == StatusReserved || r.Status == StatusExists
}

// HoldResult answers Consume (consumed, exists, not_found, closed), Commit (committed, exists,
// closed, not_found), Release (released, exists, closed, not_found) and Extend (extended, closed,
// not_found).
type HoldResult struct {
	Outcome
	// Meter and Hold: on every status but not_found and the errors.
	Meter *MeterState
	Hold  *Hold
}

// AdjustResult answers Adjust: adjusted, exists (this id was applied with the same meter and
// amount), conflict (with another meter or amount), unknown_meter.
type AdjustResult struct {
	Outcome
	Meter *MeterState
	// ID is the adjust's id, when the result carries it.
	ID string
}

// SlotResult answers AcquireSlot (acquired, exists: this job holds a slot and its lease was renewed,
// busy), RenewSlot (renewed, not_found) and ReleaseSlot (released, not_found).
type SlotResult struct {
	Outcome
	// Limit is the slots the user's plan allows: nil for a system job (empty user) or fairness off.
	Limit *int64
	Held  int64
	// LeaseExpiresAt: on acquired and exists.
	LeaseExpiresAt time.Time
	// RetryAfter: on busy, the snooze (base + jitter) to wait before trying again.
	RetryAfter time.Duration
}

// Granted reports a slot to run the job in: acquired, or exists (this job already holds it).
func (r SlotResult) Granted() bool {
	return r.Status == StatusAcquired || r.Status == StatusExists
}

// MeterUsage is one meter in a usage result.
type MeterUsage struct {
	MeterState
	Period Period
	// PeriodStart is nil for a meter of period none.
	PeriodStart  *time.Time
	PendingHolds int64
}

// HeldSlot is a job holding one of a user's slots.
type HeldSlot struct {
	Job            string
	LeaseExpiresAt time.Time
}

// SlotsUsage is a user's slots in a usage result.
type SlotsUsage struct {
	// Limit is nil with fairness off.
	Limit   *int64
	Held    int64
	Jobs    []HeldSlot
	Waiting int64
}

// UsageResult answers GetUsage: ok with the user's plan, every configured meter in configuration
// order, and slots.
type UsageResult struct {
	Outcome
	Plan   string
	Meters []MeterUsage
	Slots  SlotsUsage
}

// Meter returns the entry of meter, if the result has one.
func (r UsageResult) Meter(meter string) (MeterUsage, bool) {
	for _, usage := range r.Meters {
		if usage.Meter == meter {
			return usage, true
		}
	}
	return MeterUsage{}, false
}

// ListedHold is one hold in a list_holds result.
type ListedHold struct {
	Hold
	Meter     string
	CreatedAt time.Time
}

// ListHoldsResult answers ListHolds: ok with the holds, oldest first, and More when the limit cut the
// list.
type ListHoldsResult struct {
	Outcome
	Holds []ListedHold
	More  bool
}

// PeriodUsage is one period of a meter in a usage_history result.
type PeriodUsage struct {
	PeriodStart time.Time
	Used        int64
}

// MeterHistory is one meter's periods, newest first: the current one always (Used 0 if none), an
// earlier one only if the user had usage in it.
type MeterHistory struct {
	Meter   string
	Period  Period
	Periods []PeriodUsage
}

// UsageHistoryResult answers UsageHistory: ok with one entry per meter in configuration order,
// unknown_meter, or an answer any command may get (revision 1.3).
type UsageHistoryResult struct {
	Outcome
	History []MeterHistory
}

// UserUsage is one user in a list_usage result.
type UserUsage struct {
	User string
	Used int64
}

// ListUsageResult answers ListUsage: ok with the users by their UTF-8 bytes and More when more
// follow (ask again with After set to the last user), unknown_meter, invalid_request (revision 1.3).
type ListUsageResult struct {
	Outcome
	Usage []UserUsage
	More  bool
}

// AdminResult answers SetPlan (ok, unknown_plan) and SetLimit (ok, unknown_meter).
type AdminResult struct {
	Outcome
}

// wireResult is any result as it comes off the wire; the typed results above are read from it.
type wireResult struct {
	Status       Status     `json:"status"`
	Ref          string     `json:"ref"`
	Error        string     `json:"error"`
	Bound        LimitBound `json:"bound"`
	Max          *int64     `json:"max"`
	Meter        *string    `json:"meter"`
	Limit        *int64     `json:"limit"`
	Used         *int64     `json:"used"`
	Reserved     *int64     `json:"reserved"`
	Available    *int64     `json:"available"`
	Overage      *int64     `json:"overage"`
	ID           *string    `json:"id"`
	Amount       *int64     `json:"amount"`
	Consumed     *int64     `json:"consumed"`
	State        HoldState  `json:"state"`
	ExpiresAt    *int64     `json:"expiresAt"`
	Requested    *int64     `json:"requested"`
	PendingHolds *int64     `json:"pendingHolds"`
	Held         *int64     `json:"held"`
	LeaseExpires *int64     `json:"leaseExpiresAt"`
	RetryAfterMs *int64     `json:"retryAfterMs"`
	Plan         string     `json:"plan"`
	Meters       []struct {
		Meter        string `json:"meter"`
		Period       Period `json:"period"`
		PeriodStart  *int64 `json:"periodStart"`
		Limit        int64  `json:"limit"`
		Used         int64  `json:"used"`
		Reserved     int64  `json:"reserved"`
		Available    int64  `json:"available"`
		Overage      int64  `json:"overage"`
		PendingHolds int64  `json:"pendingHolds"`
	} `json:"meters"`
	Slots *struct {
		Limit *int64 `json:"limit"`
		Held  int64  `json:"held"`
		Jobs  []struct {
			Job            string `json:"job"`
			LeaseExpiresAt int64  `json:"leaseExpiresAt"`
		} `json:"jobs"`
		Waiting int64 `json:"waiting"`
	} `json:"slots"`
	Holds []struct {
		ID        string    `json:"id"`
		Meter     string    `json:"meter"`
		Amount    int64     `json:"amount"`
		Consumed  int64     `json:"consumed"`
		State     HoldState `json:"state"`
		ExpiresAt int64     `json:"expiresAt"`
		CreatedAt int64     `json:"createdAt"`
	} `json:"holds"`
	More    bool `json:"more"`
	History []struct {
		Meter   string `json:"meter"`
		Period  Period `json:"period"`
		Periods []struct {
			PeriodStart int64 `json:"periodStart"`
			Used        int64 `json:"used"`
		} `json:"periods"`
	} `json:"history"`
	Usage []struct {
		User string `json:"user"`
		Used int64  `json:"used"`
	} `json:"usage"`
}

func decodeWire(raw json.RawMessage) (wireResult, error) {
	var w wireResult
	err := json.Unmarshal(raw, &w)
	return w, err
}

func msTime(ms int64) time.Time { return time.UnixMilli(ms) }

func (w *wireResult) outcome() Outcome {
	o := Outcome{Status: w.Status, Ref: w.Ref, Invalid: w.Error}
	if w.Status == StatusLimitReached {
		o.LimitReached = &LimitReached{Bound: w.Bound, Max: valueOf(w.Max)}
	}
	return o
}

func valueOf(n *int64) int64 {
	if n == nil {
		return 0
	}
	return *n
}

// meterState: present when the result names a meter with its numbers (not on usage or slot results).
func (w *wireResult) meterState() *MeterState {
	if w.Meter == nil || w.Limit == nil || w.Used == nil {
		return nil
	}
	return &MeterState{
		Meter: *w.Meter, Limit: *w.Limit, Used: *w.Used, Reserved: valueOf(w.Reserved),
		Available: valueOf(w.Available), Overage: valueOf(w.Overage),
	}
}

// hold: present when the result carries a hold (its id and state).
func (w *wireResult) hold() *Hold {
	if w.ID == nil || w.State == "" {
		return nil
	}
	return &Hold{
		ID: *w.ID, Amount: valueOf(w.Amount), Consumed: valueOf(w.Consumed), State: w.State,
		ExpiresAt: msTime(valueOf(w.ExpiresAt)),
	}
}

func (w *wireResult) reserveResult() ReserveResult {
	r := ReserveResult{Outcome: w.outcome(), Meter: w.meterState(), Hold: w.hold()}
	if w.Status == StatusInsufficientQuota {
		r.Insufficient = &Insufficient{Requested: valueOf(w.Requested), PendingHolds: valueOf(w.PendingHolds)}
	}
	return r
}

func (w *wireResult) holdResult() HoldResult {
	return HoldResult{Outcome: w.outcome(), Meter: w.meterState(), Hold: w.hold()}
}

func (w *wireResult) adjustResult() AdjustResult {
	r := AdjustResult{Outcome: w.outcome(), Meter: w.meterState()}
	if w.ID != nil {
		r.ID = *w.ID
	}
	return r
}

func (w *wireResult) slotResult() SlotResult {
	r := SlotResult{Outcome: w.outcome(), Limit: w.Limit, Held: valueOf(w.Held)}
	if w.LeaseExpires != nil {
		r.LeaseExpiresAt = msTime(*w.LeaseExpires)
	}
	if w.RetryAfterMs != nil {
		r.RetryAfter = time.Duration(*w.RetryAfterMs) * time.Millisecond
	}
	return r
}

func (w *wireResult) usageResult() UsageResult {
	r := UsageResult{Outcome: w.outcome(), Plan: w.Plan}
	for _, m := range w.Meters {
		usage := MeterUsage{
			MeterState: MeterState{
				Meter: m.Meter, Limit: m.Limit, Used: m.Used, Reserved: m.Reserved,
				Available: m.Available, Overage: m.Overage,
			},
			Period:       m.Period,
			PendingHolds: m.PendingHolds,
		}
		if m.PeriodStart != nil {
			start := msTime(*m.PeriodStart)
			usage.PeriodStart = &start
		}
		r.Meters = append(r.Meters, usage)
	}
	if w.Slots != nil {
		r.Slots = SlotsUsage{Limit: w.Slots.Limit, Held: w.Slots.Held, Waiting: w.Slots.Waiting}
		for _, job := range w.Slots.Jobs {
			r.Slots.Jobs = append(r.Slots.Jobs, HeldSlot{Job: job.Job, LeaseExpiresAt: msTime(job.LeaseExpiresAt)})
		}
	}
	return r
}

func (w *wireResult) listHoldsResult() ListHoldsResult {
	r := ListHoldsResult{Outcome: w.outcome(), More: w.More}
	for _, h := range w.Holds {
		r.Holds = append(r.Holds, ListedHold{
			Hold: Hold{
				ID: h.ID, Amount: h.Amount, Consumed: h.Consumed, State: h.State,
				ExpiresAt: msTime(h.ExpiresAt),
			},
			Meter:     h.Meter,
			CreatedAt: msTime(h.CreatedAt),
		})
	}
	return r
}

func (w *wireResult) usageHistoryResult() UsageHistoryResult {
	r := UsageHistoryResult{Outcome: w.outcome()}
	for _, m := range w.History {
		history := MeterHistory{Meter: m.Meter, Period: m.Period, Periods: make([]PeriodUsage, 0, len(m.Periods))}
		for _, p := range m.Periods {
			history.Periods = append(history.Periods, PeriodUsage{PeriodStart: msTime(p.PeriodStart), Used: p.Used})
		}
		r.History = append(r.History, history)
	}
	return r
}

func (w *wireResult) listUsageResult() ListUsageResult {
	r := ListUsageResult{Outcome: w.outcome(), More: w.More}
	for _, u := range w.Usage {
		r.Usage = append(r.Usage, UserUsage{User: u.User, Used: u.Used})
	}
	return r
}
