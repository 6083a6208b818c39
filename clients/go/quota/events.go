package quota

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// EventKind is an event's `event` (PROTOCOL.md "Events", revision 1.1).
type EventKind string

const (
	EventUsageThreshold EventKind = "usage_threshold" // a meter's used crossed threshold x limit
	EventHoldExpired    EventKind = "hold_expired"    // a hold reached expiresAt without commit or release
	EventSlotExpired    EventKind = "slot_expired"    // a slot's lease ended without renew or release
	EventPlanChanged    EventKind = "plan_changed"    // set_plan changed a user's plan
	EventLimitChanged   EventKind = "limit_changed"   // set_limit changed a user's override
	// Revision 1.3: a decision changed a meter's used (a consume, a commit's charge or refund, an
	// adjust). Per user, meter and period the Amounts add up to that period's used, exactly: a billing
	// system that keeps one per EventID charges what the coordinator enforced.
	EventUsageRecorded EventKind = "usage_recorded"
)

// UsageSource is the decision a usage_recorded event comes from.
type UsageSource string

const (
	SourceConsume UsageSource = "consume"
	SourceCommit  UsageSource = "commit"
	SourceAdjust  UsageSource = "adjust"
)

// Event is one event as published. The common fields are always set; the others by kind:
//
//	usage_threshold  Meter, PeriodStart (nil for period none), Threshold, Limit, Used
//	hold_expired     Meter, ID, Amount, Consumed, Returned
//	slot_expired     Job, Plan
//	plan_changed     Plan, PreviousPlan
//	limit_changed    Meter, Limit (nil: back to the plan's default)
//	usage_recorded   Meter, PeriodStart (the period the change counts in; nil for period none),
//	                 Amount (signed: exactly how much used changed), Used (after), Source, Ref (the
//	                 hold id or the adjust id), Key (a consume's key; empty otherwise)
type Event struct {
	Kind EventKind
	// EventID is unique and stable: a re-publish after a crash carries the same one.
	EventID   string
	User      string
	Partition int
	// At is the time of the decision.
	At time.Time

	Meter        string
	PeriodStart  *time.Time
	Threshold    float64
	Limit        *int64
	Used         int64
	ID           string
	Amount       int64
	Consumed     int64
	Returned     int64
	Job          string
	Plan         string
	PreviousPlan string
	Source       UsageSource
	Ref          string
	Key          string

	// Raw is the event's JSON as published, for fields a later revision adds.
	Raw json.RawMessage
}

type wireEvent struct {
	Event        EventKind   `json:"event"`
	EventID      string      `json:"eventId"`
	User         string      `json:"user"`
	Partition    int         `json:"partition"`
	At           int64       `json:"at"`
	Meter        string      `json:"meter"`
	PeriodStart  *int64      `json:"periodStart"`
	Threshold    float64     `json:"threshold"`
	Limit        *int64      `json:"limit"`
	Used         int64       `json:"used"`
	ID           string      `json:"id"`
	Amount       int64       `json:"amount"`
	Consumed     int64       `json:"consumed"`
	Returned     int64       `json:"returned"`
	Job          string      `json:"job"`
	Plan         string      `json:"plan"`
	PreviousPlan string      `json:"previousPlan"`
	Source       UsageSource `json:"source"`
	Ref          string      `json:"ref"`
	Key          string      `json:"key"`
}

func decodeEvent(data []byte) (Event, error) {
	var w wireEvent
	if err := json.Unmarshal(data, &w); err != nil {
		return Event{}, err
	}
	if w.Event == "" {
		return Event{}, errors.New("no event kind")
	}
	e := Event{
		Kind: w.Event, EventID: w.EventID, User: w.User, Partition: w.Partition, At: msTime(w.At),
		Meter: w.Meter, Threshold: w.Threshold, Limit: w.Limit, Used: w.Used, ID: w.ID, Amount: w.Amount,
		Consumed: w.Consumed, Returned: w.Returned, Job: w.Job, Plan: w.Plan, PreviousPlan: w.PreviousPlan,
		Source: w.Source, Ref: w.Ref, Key: w.Key,
		Raw: append(json.RawMessage(nil), data...),
	}
	if w.PeriodStart != nil {
		start := msTime(*w.PeriodStart)
		e.PeriodStart = &start
	}
	return e, nil
}

// EventsOptions says which events to read and from where.
type EventsOptions struct {
	// Kinds: only these (empty: every kind).
	Kinds []EventKind
	// Durable names a durable consumer: the stream remembers what it acknowledged, and a reader started
	// again with the same name goes on from there. Empty: an ephemeral consumer from the stream's start
	// (or OnlyNew), removed by the server a few minutes after the reader stops.
	Durable string
	// Stream: the events stream (empty: the prefix's, QUOTA_EVENTS for quota; set it to what
	// QUOTA_EVENTS_STREAM names when the deployment sets that).
	Stream string
	// OnlyNew starts a new consumer at events published from now on instead of the stream's oldest.
	OnlyNew bool
	// Prefetch: events fetched ahead of the reader at most (zero: 256).
	Prefetch int
	// AckWait: an event not acknowledged within it is delivered again (zero: 30s).
	AckWait time.Duration
}

// EventStream is an iterator over a JetStream pull consumer of the events stream, with explicit acks:
// an event not acknowledged within AckWait is delivered again, so a reader that crashes loses nothing
// (and must tolerate a repeat: EventID tells them apart).
//
// NATS servers before 2.10 take one filter subject per consumer: asked for several kinds (or all), the
// consumer reads every event and the iterator acknowledges, and skips, the kinds not asked for.
type EventStream struct {
	// Consumer is the consumer's name (the durable's, or the server's for an ephemeral one).
	Consumer string
	Stream   string

	sub      *nats.Subscription
	kinds    map[EventKind]bool
	prefetch int

	mu       sync.Mutex
	buffered []*nats.Msg
}

// EventDelivery is one delivered event and how to settle it.
type EventDelivery struct {
	Event Event
	msg   *nats.Msg
}

// Ack: done with it; it is not delivered to this consumer again.
func (d EventDelivery) Ack() error { return d.msg.Ack() }

// Nak: not now; deliver it again after delay (zero: at once).
func (d EventDelivery) Nak(delay time.Duration) error {
	if delay > 0 {
		return d.msg.NakWithDelay(delay)
	}
	return d.msg.Nak()
}

// Term: never; drop it for this consumer (a poison message).
func (d EventDelivery) Term() error { return d.msg.Term() }

const (
	eventsAckWaitDefault       = 30 * time.Second
	eventsPrefetchDefault      = 256
	ephemeralInactiveThreshold = 5 * time.Minute
)

// EventsStreamName is the default name of a prefix's events stream: the prefix in upper case, dots as
// underscores, followed by _EVENTS (QUOTA_EVENTS for quota).
func EventsStreamName(prefix string) string {
	return strings.ReplaceAll(strings.ToUpper(prefix), ".", "_") + "_EVENTS"
}

// Events subscribes to the coordinator's events; it returns once the consumer exists on the server.
// Read them with Next; Stop when done (a durable consumer stays on the server for the next reader).
func (c *Client) Events(ctx context.Context, options EventsOptions) (*EventStream, error) {
	js, err := c.nc.JetStream(nats.Context(ctx))
	if err != nil {
		return nil, err
	}
	stream := options.Stream
	if stream == "" {
		stream = EventsStreamName(c.options.Prefix)
	}
	kinds := map[EventKind]bool{}
	for _, kind := range options.Kinds {
		kinds[kind] = true
	}
	filter := c.options.Prefix + ".v1.events.>"
	if len(kinds) == 1 {
		filter = c.options.Prefix + ".v1.events." + string(options.Kinds[0]) + ".*"
	}
	if len(kinds) <= 1 {
		kinds = nil // the filter subject does the selecting
	}
	ackWait := options.AckWait
	if ackWait <= 0 {
		ackWait = eventsAckWaitDefault
	}
	config := &nats.ConsumerConfig{
		AckPolicy:     nats.AckExplicitPolicy,
		AckWait:       ackWait,
		FilterSubject: filter,
		DeliverPolicy: nats.DeliverAllPolicy,
	}
	if options.OnlyNew {
		config.DeliverPolicy = nats.DeliverNewPolicy
	}
	var name string
	if options.Durable == "" {
		config.InactiveThreshold = ephemeralInactiveThreshold
		info, err := js.AddConsumer(stream, config, nats.Context(ctx))
		if err != nil {
			return nil, fmt.Errorf("quota: creating a consumer of %s: %w", stream, err)
		}
		name = info.Name
	} else {
		name = options.Durable
		info, err := js.ConsumerInfo(stream, name, nats.Context(ctx))
		switch {
		case errors.Is(err, nats.ErrConsumerNotFound):
			config.Durable = name
			if _, err := js.AddConsumer(stream, config, nats.Context(ctx)); err != nil {
				return nil, fmt.Errorf("quota: creating consumer %s of %s: %w", name, stream, err)
			}
		case err != nil:
			return nil, fmt.Errorf("quota: reading consumer %s of %s: %w", name, stream, err)
		case info.Config.FilterSubject != filter:
			// The same durable asked for other kinds: it keeps its place and changes its filter.
			updated := info.Config
			updated.FilterSubject = filter
			if _, err := js.UpdateConsumer(stream, &updated, nats.Context(ctx)); err != nil {
				return nil, fmt.Errorf("quota: updating consumer %s of %s: %w", name, stream, err)
			}
		}
	}
	// Bound by name only: nats.go would otherwise ask an ephemeral consumer to be durable.
	sub, err := js.PullSubscribe(filter, "", nats.Bind(stream, name))
	if err != nil {
		return nil, fmt.Errorf("quota: subscribing to consumer %s of %s: %w", name, stream, err)
	}
	prefetch := options.Prefetch
	if prefetch <= 0 {
		prefetch = eventsPrefetchDefault
	}
	return &EventStream{Consumer: name, Stream: stream, sub: sub, kinds: kinds, prefetch: prefetch}, nil
}

// Next returns the next event of the kinds asked for, waiting for one until ctx ends (then it returns
// ctx's error). An event that is not valid JSON is terminated and skipped.
func (s *EventStream) Next(ctx context.Context) (EventDelivery, error) {
	for {
		msg, err := s.nextMessage(ctx)
		if err != nil {
			return EventDelivery{}, err
		}
		event, err := decodeEvent(msg.Data)
		if err != nil {
			_ = msg.Term()
			continue
		}
		if s.kinds != nil && !s.kinds[event.Kind] {
			_ = msg.Ack()
			continue
		}
		return EventDelivery{Event: event, msg: msg}, nil
	}
}

const (
	// eventsBacklogWait: how long a pull for a batch waits. nats.go's Fetch asks first for what is
	// there (no wait) and returns it at once; only on an empty stream does it wait, for a whole batch.
	eventsBacklogWait = 25 * time.Millisecond
	// eventsFetchWait: how long a pull for one event waits on the server before asking again.
	eventsFetchWait = 5 * time.Second
)

func (s *EventStream) nextMessage(ctx context.Context) (*nats.Msg, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for attempt := 0; len(s.buffered) == 0; attempt++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		// The backlog in batches; when there is none, one event as soon as it comes.
		batch, wait := s.prefetch, eventsBacklogWait
		if attempt%2 == 1 {
			batch, wait = 1, eventsFetchWait
		}
		pull, cancel := context.WithTimeout(ctx, wait)
		msgs, err := s.sub.Fetch(batch, nats.Context(pull))
		cancel()
		if err != nil && ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if err != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, nats.ErrTimeout) {
			return nil, fmt.Errorf("quota: fetching events of %s: %w", s.Stream, err)
		}
		s.buffered = msgs
	}
	msg := s.buffered[0]
	s.buffered = s.buffered[1:]
	return msg, nil
}

// Stop ends the subscription. Events fetched and not acknowledged are delivered again after AckWait.
// A durable consumer stays on the server; an ephemeral one goes a few minutes later.
func (s *EventStream) Stop() error {
	return s.sub.Unsubscribe()
}
