package quota

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// Coalescing. Each subject (one partition's .ops or .admin) has a lane. With nothing in flight on the
// lane a command goes at once, in a message of its own: no added latency when idle. While a message is
// in flight, commands queue and go together, as one array body, when it returns; a queue that reaches
// BatchMax commands (or the message size limit) goes at once, in flight or not. Under load batches grow
// to what arrives during one round trip, which is where they pay (PERFORMANCE notes: ~130 000 ops/s
// at 16 commands per message against ~3 300 messages/s one at a time).
//
// A command that waits for a slot (acquire_slot with a wait) holds back its whole message's reply
// (PROTOCOL.md), so it goes alone, outside the lane.

const (
	serviceErrorCodeHeader = "Nats-Service-Error-Code"
	serviceErrorHeader     = "Nats-Service-Error"
	// Bytes of the brackets a batch adds around its commands.
	batchOverheadBytes = 2
)

// outcome of one attempt of one command: a result, a retryable outcome, or an error.
type outcome struct {
	result wireResult
	retry  RetryReason
	err    error
}

type pendingCommand struct {
	ctx     context.Context
	body    []byte
	timeout time.Duration
	done    chan outcome // buffered 1: delivered once
}

func (p *pendingCommand) deliver(o outcome) {
	select {
	case p.done <- o:
	default:
	}
}

type lane struct {
	subject     string
	mu          sync.Mutex
	queued      []*pendingCommand
	queuedBytes int
	inFlight    int
}

func (c *Client) laneOf(subject string) (*lane, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, ErrClosed
	}
	l := c.lanes[subject]
	if l == nil {
		l = &lane{subject: subject}
		c.lanes[subject] = l
	}
	return l, nil
}

// submit hands a command to its lane (or sends it alone); its outcome arrives on p.done.
func (c *Client) submit(subject string, p *pendingCommand, alone bool) error {
	l, err := c.laneOf(subject)
	if err != nil {
		return err
	}
	// Under the lane's lock, so that Close (which takes it after setting isClosed) sees every message
	// started before it waits for them.
	l.mu.Lock()
	defer l.mu.Unlock()
	if c.isClosed.Load() {
		return ErrClosed
	}
	if alone {
		c.startSend(subject, []*pendingCommand{p}, nil)
		return nil
	}
	size := len(p.body) + 1
	if len(l.queued) > 0 && l.queuedBytes+size+batchOverheadBytes > c.messageBytesMax {
		// The batch is full by size: it goes now, whatever is in flight; this command starts the next.
		l.inFlight++
		c.startSend(subject, l.takeQueued(), l)
	}
	l.queued = append(l.queued, p)
	l.queuedBytes += size
	if l.inFlight == 0 || len(l.queued) >= c.options.BatchMax {
		l.inFlight++
		c.startSend(subject, l.takeQueued(), l)
	}
	return nil
}

func (l *lane) takeQueued() []*pendingCommand {
	batch := l.queued
	l.queued, l.queuedBytes = nil, 0
	return batch
}

func (c *Client) startSend(subject string, batch []*pendingCommand, l *lane) {
	c.sending.Add(1)
	go func() {
		defer c.sending.Done()
		c.send(subject, batch)
		if l == nil {
			return
		}
		l.mu.Lock()
		l.inFlight--
		if l.inFlight == 0 && len(l.queued) > 0 {
			next := l.takeQueued()
			l.inFlight++
			c.startSend(subject, next, l)
		}
		l.mu.Unlock()
	}()
}

// send publishes one message carrying batch and delivers each command's outcome.
func (c *Client) send(subject string, batch []*pendingCommand) {
	// A caller whose context ended no longer waits: its command is not sent (it may have been by an
	// earlier attempt; the same id says what stands).
	live := batch[:0:0]
	timeout := time.Duration(0)
	for _, p := range batch {
		if p.ctx.Err() != nil {
			continue
		}
		live = append(live, p)
		if p.timeout > timeout {
			timeout = p.timeout
		}
	}
	if len(live) == 0 {
		return
	}
	var body bytes.Buffer
	body.WriteByte('[')
	for index, p := range live {
		if index > 0 {
			body.WriteByte(',')
		}
		body.Write(p.body)
	}
	body.WriteByte(']')
	c.messagesSent.Add(1)
	c.commandsSent.Add(int64(len(live)))
	reply, err := c.nc.RequestMsg(&nats.Msg{Subject: subject, Data: body.Bytes()}, timeout)
	if err != nil {
		failure := outcome{err: &TransportError{Subject: subject, Reason: "request failed", Err: err}}
		switch {
		case errors.Is(err, nats.ErrNoResponders):
			failure = outcome{retry: RetryNoResponders}
		case errors.Is(err, nats.ErrTimeout), errors.Is(err, context.DeadlineExceeded):
			failure = outcome{retry: RetryTimeout}
		case errors.Is(err, nats.ErrConnectionClosed):
			failure = outcome{err: &TransportError{Subject: subject, Reason: "the NATS connection is closed", Err: err}}
		}
		for _, p := range live {
			p.deliver(failure)
		}
		return
	}
	for index, o := range c.outcomesOf(subject, reply, len(live)) {
		live[index].deliver(o)
	}
}

// outcomesOf reads a reply: one outcome per command, in request order.
func (c *Client) outcomesOf(subject string, reply *nats.Msg, count int) []outcome {
	all := func(o outcome) []outcome {
		outcomes := make([]outcome, count)
		for index := range outcomes {
			outcomes[index] = o
		}
		return outcomes
	}
	if code := reply.Header.Get(serviceErrorCodeHeader); code != "" {
		number, _ := strconv.Atoi(code)
		return all(outcome{err: &ServiceError{Subject: subject, Code: number, Description: reply.Header.Get(serviceErrorHeader)}})
	}
	var results []json.RawMessage
	if err := json.Unmarshal(reply.Data, &results); err != nil {
		return all(outcome{err: &TransportError{Subject: subject, Reason: "reply is not a JSON array", Err: err}})
	}
	if len(results) != count {
		return all(outcome{err: &TransportError{Subject: subject, Reason: "reply has " + strconv.Itoa(len(results)) + " results for " + strconv.Itoa(count) + " commands"}})
	}
	outcomes := make([]outcome, count)
	for index, raw := range results {
		result, err := decodeWire(raw)
		switch {
		case err != nil || result.Status == "":
			outcomes[index] = outcome{err: &TransportError{Subject: subject, Reason: "result " + strconv.Itoa(index) + " has no status", Err: err}}
		case result.Status == StatusUnavailable:
			outcomes[index] = outcome{retry: RetryUnavailable}
		case result.Status == StatusOverloaded:
			outcomes[index] = outcome{retry: RetryOverloaded}
		default:
			outcomes[index] = outcome{result: result}
		}
	}
	return outcomes
}
