package quota

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand"
	"regexp"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
)

// Protocol limits (PROTOCOL.md "Messages").
const (
	// BatchCommandsMax is the most commands one message may carry.
	BatchCommandsMax = 1000
	// messageBytesMax is the largest body the coordinator takes (and NATS's default max_payload).
	messageBytesMax = 1 << 20
	// partitionsMax is the most partitions a deployment may have (QUOTA_PARTITIONS).
	partitionsMax = 65536
)

// Defaults, the TypeScript client's (src/domain/limits.ts).
const (
	DefaultPrefix         = "quota"
	DefaultPartitions     = 64
	DefaultRequestTimeout = 5 * time.Second
	DefaultCallTimeout    = 30 * time.Second
	DefaultRetryBaseDelay = 50 * time.Millisecond
	DefaultRetryMaxDelay  = 2 * time.Second
)

// RetryPolicy: backoff between attempts of a retried command, capped exponential with equal jitter
// (half of the delay fixed so it still grows, half random so clients that failed together do not all
// come back in the same millisecond).
type RetryPolicy struct {
	// BaseDelay before the first retry; it doubles per attempt. Zero: 50ms.
	BaseDelay time.Duration
	// MaxDelay: the longest backoff. Zero: 2s.
	MaxDelay time.Duration
	// AttemptsMax caps the attempts, the first included. Zero: no cap; the context's deadline (or
	// CallTimeout) ends the retries.
	AttemptsMax int
}

// Options of a Client. The zero value is the defaults of a deployment with the default settings.
type Options struct {
	// Prefix: the deployment's QUOTA_PREFIX. Empty: "quota".
	Prefix string
	// Partitions: the deployment's QUOTA_PARTITIONS; must match the coordinator's. Zero: 64.
	Partitions int
	// RequestTimeout: how long one message waits for its reply before it is retried. Zero: 5s.
	RequestTimeout time.Duration
	// CallTimeout bounds a call whose context has no deadline, retries included. Zero: 30s.
	CallTimeout time.Duration
	Retry       RetryPolicy
	// BatchMax: commands coalesced into one message, 1 (no batching) to 1000. Zero: 1000.
	BatchMax int
}

var prefixPattern = regexp.MustCompile(`^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$`)

func (o Options) resolved() (Options, error) {
	if o.Prefix == "" {
		o.Prefix = DefaultPrefix
	}
	if !prefixPattern.MatchString(o.Prefix) {
		return o, fmt.Errorf("quota: Options.Prefix must be NATS subject tokens of letters, digits, _ or - separated by dots, got %q", o.Prefix)
	}
	if o.Partitions == 0 {
		o.Partitions = DefaultPartitions
	}
	if o.Partitions < 1 || o.Partitions > partitionsMax {
		return o, fmt.Errorf("quota: Options.Partitions must be 1 to %d, got %d", partitionsMax, o.Partitions)
	}
	if o.RequestTimeout == 0 {
		o.RequestTimeout = DefaultRequestTimeout
	}
	if o.CallTimeout == 0 {
		o.CallTimeout = DefaultCallTimeout
	}
	if o.Retry.BaseDelay == 0 {
		o.Retry.BaseDelay = DefaultRetryBaseDelay
	}
	if o.Retry.MaxDelay == 0 {
		o.Retry.MaxDelay = DefaultRetryMaxDelay
	}
	if o.Retry.MaxDelay < o.Retry.BaseDelay {
		o.Retry.MaxDelay = o.Retry.BaseDelay
	}
	if o.BatchMax == 0 {
		o.BatchMax = BatchCommandsMax
	}
	if o.RequestTimeout < 0 || o.CallTimeout < 0 || o.Retry.BaseDelay < 0 || o.Retry.AttemptsMax < 0 {
		return o, errors.New("quota: Options durations and Retry.AttemptsMax must not be negative")
	}
	if o.BatchMax < 1 || o.BatchMax > BatchCommandsMax {
		return o, fmt.Errorf("quota: Options.BatchMax must be 1 to %d, got %d", BatchCommandsMax, o.BatchMax)
	}
	return o, nil
}

// Stats counts since the client was made.
type Stats struct {
	// MessagesSent: request messages published, retries included.
	MessagesSent int64
	// CommandsSent: commands carried by those messages, retries included.
	CommandsSent int64
	// Retries: attempts after the first.
	Retries int64
}

// Client sends commands to the coordinator. It is safe for concurrent use; concurrent calls for one
// partition share messages.
type Client struct {
	nc              *nats.Conn
	ownsConnection  bool
	options         Options
	messageBytesMax int

	mu     sync.Mutex
	lanes  map[string]*lane
	closed bool
	// isClosed is closed, readable under a lane's lock.
	isClosed atomic.Bool
	closing  chan struct{}
	sending  sync.WaitGroup

	randomMu sync.Mutex
	random   *rand.Rand

	messagesSent atomic.Int64
	commandsSent atomic.Int64
	retries      atomic.Int64
}

// New returns a client on an existing connection, which stays the caller's (Close leaves it open).
func New(nc *nats.Conn, options Options) (*Client, error) {
	if nc == nil {
		return nil, errors.New("quota: New needs a NATS connection")
	}
	resolved, err := options.resolved()
	if err != nil {
		return nil, err
	}
	bytesMax := messageBytesMax
	// A server configured below the protocol's 1 MiB would refuse our largest batches outright.
	if serverMax := nc.MaxPayload(); serverMax > 0 && serverMax < int64(bytesMax) {
		bytesMax = int(serverMax)
	}
	return &Client{
		nc:              nc,
		options:         resolved,
		messageBytesMax: bytesMax,
		lanes:           map[string]*lane{},
		closing:         make(chan struct{}),
		random:          rand.New(rand.NewSource(time.Now().UnixNano())),
	}, nil
}

// Connect connects to NATS with the settings of the environment (NATSOptionsFromEnv: NATS_URL,
// NATS_CREDS, NATS_NKEY, NATS_USER/NATS_PASSWORD, NATS_TOKEN, NATS_CA/NATS_CERT/NATS_KEY), then
// natsOptions, and returns a client that closes the connection on Close. The deployment's prefix and
// partitions come from options, else QUOTA_PREFIX and QUOTA_PARTITIONS (SettingsFromEnv), and are
// checked against the running coordinators of the prefix (Discover, up to a second): options.Partitions
// zero and QUOTA_PARTITIONS unset take the service's count, and a count that disagrees with it is a
// *SettingsError. With no coordinator answering, the configured count (or 64) is used.
func Connect(options Options, natsOptions ...nats.Option) (*Client, error) {
	url, fromEnv, err := NATSOptionsFromEnv(nil)
	if err != nil {
		return nil, err
	}
	nc, err := nats.Connect(url, append(append([]nats.Option{nats.Name("quota-client-go")}, fromEnv...), natsOptions...)...)
	if err != nil {
		return nil, fmt.Errorf("quota: cannot connect to NATS at %s: %w", redactURLs(url), err)
	}
	resolved, err := resolveDeployment(nc, options, nil)
	if err != nil {
		nc.Close()
		return nil, err
	}
	client, err := New(nc, resolved)
	if err != nil {
		nc.Close()
		return nil, err
	}
	client.ownsConnection = true
	return client, nil
}

// Conn is the client's NATS connection.
func (c *Client) Conn() *nats.Conn { return c.nc }

// Options are the client's options with the defaults filled in.
func (c *Client) Options() Options { return c.options }

// Stats are the client's counts so far.
func (c *Client) Stats() Stats {
	return Stats{MessagesSent: c.messagesSent.Load(), CommandsSent: c.commandsSent.Load(), Retries: c.retries.Load()}
}

// Close fails what is queued or waiting to be retried with ErrClosed, waits for the messages in flight,
// then closes the NATS connection if Connect opened it.
func (c *Client) Close() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	c.isClosed.Store(true)
	close(c.closing)
	lanes := make([]*lane, 0, len(c.lanes))
	for _, l := range c.lanes {
		lanes = append(lanes, l)
	}
	c.mu.Unlock()
	for _, l := range lanes {
		l.mu.Lock()
		queued := l.queued
		l.queued, l.queuedBytes = nil, 0
		l.mu.Unlock()
		for _, command := range queued {
			command.deliver(outcome{err: ErrClosed})
		}
	}
	c.sending.Wait()
	if c.ownsConnection {
		c.nc.Close()
	}
}

type subjectKind string

const (
	kindOps   subjectKind = "ops"
	kindAdmin subjectKind = "admin"
)

// Subject is the subject of a user's commands: {prefix}.v1.{partition}.ops, or .admin when admin.
func (c *Client) Subject(user string, admin bool) string {
	kind := kindOps
	if admin {
		kind = kindAdmin
	}
	return c.subject(user, kind)
}

func (c *Client) subject(user string, kind subjectKind) string {
	return fmt.Sprintf("%s.v1.%d.%s", c.options.Prefix, Partition(user, c.options.Partitions), kind)
}

// retryAttemptMin is the least time left worth another attempt of a retried command. With less left
// the call waits out its deadline and reports it: it never gives up while time is left.
const retryAttemptMin = 10 * time.Millisecond

// call sends one command to its user's partition and returns its result, retrying what the protocol
// says is safe to retry until the context's deadline (or CallTimeout). The command is encoded once:
// every attempt sends the same bytes. A backoff that would pass the deadline shrinks so that a last
// attempt gets what is left (half of it, or the request timeout if shorter), and no message waits for
// its reply past the deadline.
func (c *Client) call(ctx context.Context, kind subjectKind, about target, op string, command any, wait time.Duration) (wireResult, error) {
	return c.callSubject(ctx, c.subject(about.user, kind), about, op, command, wait)
}

// callSubject is call on a subject named by the caller: list_usage names a partition, not a user.
func (c *Client) callSubject(ctx context.Context, subject string, about target, op string, command any, wait time.Duration) (wireResult, error) {
	body, err := json.Marshal(command)
	if err != nil {
		return wireResult{}, fmt.Errorf("quota: %s of %s: encoding the command: %w", op, about, err)
	}
	if _, hasDeadline := ctx.Deadline(); !hasDeadline {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.options.CallTimeout+wait)
		defer cancel()
	}
	deadline, _ := ctx.Deadline()
	started := time.Now()
	var reason RetryReason
	stopped := func(attempts int, err error) error {
		if reason != "" {
			return &RetriesExhaustedError{Op: op, User: about.user, Target: about.what, Subject: subject, Attempts: attempts, Reason: reason, Elapsed: time.Since(started), Err: err}
		}
		return &CallError{Op: op, User: about.user, Target: about.what, Subject: subject, Err: err}
	}
	for attempt := 1; ; attempt++ {
		if attempt > 1 {
			c.retries.Add(1)
		}
		timeout := c.options.RequestTimeout + wait
		if left := time.Until(deadline); left < timeout {
			timeout = left
		}
		if timeout < time.Millisecond {
			timeout = time.Millisecond
		}
		pending := &pendingCommand{ctx: ctx, body: body, done: make(chan outcome, 1), timeout: timeout}
		if err := c.submit(subject, pending, wait > 0); err != nil {
			return wireResult{}, stopped(attempt, err)
		}
		var got outcome
		select {
		case got = <-pending.done:
		case <-ctx.Done():
			return wireResult{}, stopped(attempt, ctx.Err())
		}
		if got.err != nil {
			return wireResult{}, &CallError{Op: op, User: about.user, Target: about.what, Subject: subject, Err: got.err}
		}
		if got.retry == "" {
			return got.result, nil
		}
		reason = got.retry
		if c.options.Retry.AttemptsMax > 0 && attempt >= c.options.Retry.AttemptsMax {
			return wireResult{}, stopped(attempt, nil)
		}
		delay := c.backoff(attempt)
		left := time.Until(deadline)
		if left < retryAttemptMin {
			// No time worth an attempt: wait out the deadline rather than report it early.
			select {
			case <-ctx.Done():
				return wireResult{}, stopped(attempt, ctx.Err())
			case <-c.closing:
				return wireResult{}, stopped(attempt, ErrClosed)
			}
		}
		if lastAttempt := minDuration(c.options.RequestTimeout+wait, left/2); delay > left-lastAttempt {
			delay = left - lastAttempt
		}
		timer := time.NewTimer(delay)
		select {
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			return wireResult{}, stopped(attempt, ctx.Err())
		case <-c.closing:
			timer.Stop()
			return wireResult{}, stopped(attempt, ErrClosed)
		}
	}
}

func minDuration(a, b time.Duration) time.Duration {
	if a < b {
		return a
	}
	return b
}

// backoff before the next attempt after `attempts` failed ones: equal jitter over a capped exponential.
func (c *Client) backoff(attempts int) time.Duration {
	ceiling := c.options.Retry.MaxDelay
	if shift := attempts - 1; shift < 30 {
		if exponential := c.options.Retry.BaseDelay << shift; exponential > 0 && exponential < ceiling {
			ceiling = exponential
		}
	}
	c.randomMu.Lock()
	random := c.random.Float64()
	c.randomMu.Unlock()
	return ceiling/2 + time.Duration(random*float64(ceiling/2))
}
