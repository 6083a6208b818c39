package quota

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

// Seed 000 (ADR-21): 16 concurrent reserves of 10 against a limit of 10. The seed's own check-then-
// insert granted 12 of them; exactly one may be granted.
func TestSeed000RaceSixteenGoroutinesOneGrant(t *testing.T) {
	for _, variant := range []struct {
		name    string
		clients func(t *testing.T) []*Client
	}{
		{"one client, its commands batched", func(t *testing.T) []*Client { return []*Client{testClient} }},
		{"sixteen clients on sixteen connections", sixteenClients},
	} {
		t.Run(variant.name, func(t *testing.T) {
			ctx := testContext(t, 20*time.Second)
			user := unique("seed000")
			setLimit(t, user, "analysis", 10)
			clients := variant.clients(t)
			before := testClient.Stats()

			start := make(chan struct{})
			results := make([]ReserveResult, 16)
			errs := make([]error, 16)
			var wg sync.WaitGroup
			for i := 0; i < 16; i++ {
				wg.Add(1)
				go func(i int) {
					defer wg.Done()
					<-start
					c := clients[i%len(clients)]
					results[i], errs[i] = c.Reserve(ctx, Reserve{User: user, Meter: "analysis", Amount: 10, ID: fmt.Sprintf("analysis-%d", i)})
				}(i)
			}
			close(start)
			wg.Wait()
			after := testClient.Stats()

			granted := 0
			for i := range results {
				if errs[i] != nil {
					t.Fatalf("reserve %d: %v", i, errs[i])
				}
				switch results[i].Status {
				case StatusReserved:
					granted++
				case StatusInsufficientQuota:
				default:
					t.Fatalf("reserve %d: status %q", i, results[i].Status)
				}
			}
			if granted != 1 {
				t.Fatalf("%d of 16 reserves of 10 granted against a limit of 10, want exactly 1", granted)
			}
			if m := meterOf(t, user, "analysis"); m.Reserved != 10 || m.PendingHolds != 1 || m.Available != 0 {
				t.Fatalf("the coordinator holds %+v, want one hold of 10", m)
			}
			if len(clients) == 1 {
				messages, commands := after.MessagesSent-before.MessagesSent, after.CommandsSent-before.CommandsSent
				t.Logf("16 reserves went in %d messages", messages)
				if commands != 16 || messages >= commands {
					t.Fatalf("%d commands in %d messages: concurrent commands of one partition were not batched", commands, messages)
				}
			}
		})
	}
}

func sixteenClients(t *testing.T) []*Client {
	clients := make([]*Client, 16)
	for i := range clients {
		c, err := Connect(testOptions())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		clients[i] = c
	}
	return clients
}

// Batching where it pays: many concurrent commands of one partition share few messages, and each
// caller gets its own result.
func TestConcurrentCommandsShareMessages(t *testing.T) {
	ctx := testContext(t, 20*time.Second)
	c, err := New(testNC, testOptions())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// 200 users of one partition.
	var users []string
	for len(users) < 200 {
		if user := unique("batch"); Partition(user, testPartitions) == 3 {
			users = append(users, user)
		}
	}
	var wg sync.WaitGroup
	results := make([]AdjustResult, len(users))
	errs := make([]error, len(users))
	for i, user := range users {
		wg.Add(1)
		go func(i int, user string) {
			defer wg.Done()
			results[i], errs[i] = c.Adjust(ctx, Adjust{User: user, Meter: "tokens", Amount: int64(i + 1), ID: "a"})
		}(i, user)
	}
	wg.Wait()
	for i := range users {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if results[i].Status != StatusAdjusted || results[i].Meter.Used != int64(i+1) {
			t.Fatalf("caller %d got %q used %d, want its own adjust of %d", i, results[i].Status, results[i].Meter.Used, i+1)
		}
	}
	stats := c.Stats()
	t.Logf("200 commands in %d messages", stats.MessagesSent)
	if stats.CommandsSent != 200 || stats.MessagesSent > 100 {
		t.Fatalf("%d commands in %d messages: expected them batched", stats.CommandsSent, stats.MessagesSent)
	}
}
