package quota

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// PROTOCOL.md revision 1.3's billing calls: UsageHistory and ListUsage send the shared vectors' commands
// (vectorsFile "billing", which test/client/billing.test.ts reads too) to the right .admin subject and
// read the replies; usage_recorded bodies decode; UsagePages walks every partition. A stand-in answers
// here; TestBillingAgainstTheCoordinator runs them against the real one.

type billingCallVector struct {
	Note  string                 `json:"note"`
	Op    string                 `json:"op"`
	Input map[string]interface{} `json:"input"`
	Wire  map[string]interface{} `json:"wire"`
	Reply map[string]interface{} `json:"reply"`
}

type billingEventVector struct {
	Note string                 `json:"note"`
	Body map[string]interface{} `json:"body"`
}

func readBillingVectors(t *testing.T) ([]billingCallVector, []billingEventVector) {
	t.Helper()
	var file struct {
		Billing struct {
			Calls  []billingCallVector  `json:"calls"`
			Events []billingEventVector `json:"events"`
		} `json:"billing"`
	}
	decodeVectors(t, &file)
	if len(file.Billing.Calls) == 0 || len(file.Billing.Events) == 0 {
		t.Fatal("no billing vectors")
	}
	return file.Billing.Calls, file.Billing.Events
}

// canonical is v as JSON with sorted keys and numbers as written: two values are the same JSON value
// exactly when their canonical forms are equal.
func canonical(t *testing.T, v interface{}) string {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var generic interface{}
	decoder := json.NewDecoder(strings.NewReader(string(data)))
	decoder.UseNumber()
	if err := decoder.Decode(&generic); err != nil {
		t.Fatal(err)
	}
	out, err := json.Marshal(generic)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

func text(v interface{}) string {
	if v == nil {
		return ""
	}
	return fmt.Sprint(v)
}

func integer(t *testing.T, v interface{}) int64 {
	t.Helper()
	if v == nil {
		return 0
	}
	n, err := strconv.ParseInt(fmt.Sprint(v), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// outcomeWire is the common fields of a result as the wire carries them.
func outcomeWire(o Outcome) map[string]interface{} {
	m := map[string]interface{}{"status": string(o.Status)}
	if o.Ref != "" {
		m["ref"] = o.Ref
	}
	if o.Invalid != "" {
		m["error"] = o.Invalid
	}
	return m
}

func usageHistoryWire(r UsageHistoryResult) map[string]interface{} {
	m := outcomeWire(r.Outcome)
	if r.Status == StatusOK {
		history := []interface{}{}
		for _, h := range r.History {
			periods := []interface{}{}
			for _, p := range h.Periods {
				periods = append(periods, map[string]interface{}{"periodStart": p.PeriodStart.UnixMilli(), "used": p.Used})
			}
			history = append(history, map[string]interface{}{"meter": h.Meter, "period": string(h.Period), "periods": periods})
		}
		m["history"] = history
	}
	return m
}

func listUsageWire(r ListUsageResult) map[string]interface{} {
	m := outcomeWire(r.Outcome)
	if r.Status == StatusOK {
		usage := []interface{}{}
		for _, u := range r.Usage {
			usage = append(usage, map[string]interface{}{"user": u.User, "used": u.Used})
		}
		m["usage"], m["more"] = usage, r.More
	}
	return m
}

// billingStandIn answers each message with answer(partition, command), recording subjects and commands.
type billingStandIn struct {
	mu       sync.Mutex
	subjects []string
	commands []map[string]interface{}
}

func startBillingStandIn(t *testing.T, answer func(partition int, command map[string]interface{}) interface{}) (*billingStandIn, string) {
	s := &billingStandIn{}
	prefix, _ := fakeCoordinator(t, func(msg *nats.Msg) {
		var batch []map[string]interface{}
		decoder := json.NewDecoder(strings.NewReader(string(msg.Data)))
		decoder.UseNumber()
		if err := decoder.Decode(&batch); err != nil {
			t.Errorf("not a batch: %s", msg.Data)
			return
		}
		partition, _ := strconv.Atoi(strings.Split(msg.Subject, ".")[2])
		replies := []interface{}{}
		s.mu.Lock()
		for _, command := range batch {
			s.subjects = append(s.subjects, msg.Subject)
			s.commands = append(s.commands, command)
			replies = append(replies, answer(partition, command))
		}
		s.mu.Unlock()
		data, _ := json.Marshal(replies)
		_ = msg.Respond(data)
	})
	return s, prefix
}

func (s *billingStandIn) sent() ([]string, []map[string]interface{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.subjects...), append([]map[string]interface{}(nil), s.commands...)
}

func TestBillingVectorsSharedWithTypeScript(t *testing.T) {
	calls, _ := readBillingVectors(t)
	for _, vector := range calls {
		t.Run(vector.Note, func(t *testing.T) {
			ctx := testContext(t, 10*time.Second)
			standIn, prefix := startBillingStandIn(t, func(int, map[string]interface{}) interface{} { return vector.Reply })
			c := clientWithPrefix(t, prefix, func(o *Options) { o.Partitions = 64 })
			in := vector.Input
			var got map[string]interface{}
			var partition int
			switch vector.Op {
			case "usage_history":
				r, err := c.Admin().UsageHistory(ctx, UsageHistory{User: text(in["user"]), Meter: text(in["meter"]), Periods: int(integer(t, in["periods"])), Ref: text(in["ref"])})
				if err != nil {
					t.Fatal(err)
				}
				got, partition = usageHistoryWire(r), Partition(text(in["user"]), 64)
			case "list_usage":
				listing := ListUsage{Partition: int(integer(t, in["partition"])), Meter: text(in["meter"]), After: text(in["after"]), Limit: int(integer(t, in["limit"])), Ref: text(in["ref"])}
				if in["periodStart"] != nil {
					listing.PeriodStart = time.UnixMilli(integer(t, in["periodStart"]))
				}
				r, err := c.Admin().ListUsage(ctx, listing)
				if err != nil {
					t.Fatal(err)
				}
				got, partition = listUsageWire(r), listing.Partition
			default:
				t.Fatalf("unknown op %q", vector.Op)
			}
			subjects, commands := standIn.sent()
			if len(commands) != 1 || subjects[0] != fmt.Sprintf("%s.v1.%d.admin", prefix, partition) {
				t.Fatalf("sent %v to %v", commands, subjects)
			}
			if canonical(t, commands[0]) != canonical(t, vector.Wire) {
				t.Fatalf("command %s, want %s", canonical(t, commands[0]), canonical(t, vector.Wire))
			}
			if canonical(t, got) != canonical(t, vector.Reply) {
				t.Fatalf("read %s, want %s", canonical(t, got), canonical(t, vector.Reply))
			}
		})
	}
}

func TestUsageRecordedEventVectors(t *testing.T) {
	_, events := readBillingVectors(t)
	for _, vector := range events {
		data, err := json.Marshal(vector.Body)
		if err != nil {
			t.Fatal(err)
		}
		e, err := decodeEvent(data)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]interface{}{
			"event": string(e.Kind), "eventId": e.EventID, "user": e.User, "partition": e.Partition, "at": e.At.UnixMilli(),
			"meter": e.Meter, "periodStart": nil, "amount": e.Amount, "used": e.Used, "source": string(e.Source), "ref": e.Ref,
		}
		if e.PeriodStart != nil {
			got["periodStart"] = e.PeriodStart.UnixMilli()
		}
		if e.Key != "" {
			got["key"] = e.Key
		}
		if e.Kind != EventUsageRecorded || canonical(t, got) != canonical(t, vector.Body) {
			t.Fatalf("%s: decoded %s, want %s", vector.Note, canonical(t, got), canonical(t, vector.Body))
		}
	}
}

// byUTF8 lists users after `after` in their UTF-8 byte order (Go compares strings by bytes), at most limit.
func byUTF8(users map[string]int64, after string, limit int) ([]interface{}, bool) {
	names := make([]string, 0, len(users))
	for name := range users {
		if after == "" || name > after {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	more := len(names) > limit
	if more {
		names = names[:limit]
	}
	usage := []interface{}{}
	for _, name := range names {
		usage = append(usage, map[string]interface{}{"user": name, "used": users[name]})
	}
	return usage, more
}

func TestUsagePagesWalksEveryPartitionPageByPage(t *testing.T) {
	ctx := testContext(t, 20*time.Second)
	listed := map[int]map[string]int64{
		0:  {"z": 1, "a": 2, "é": 3, "m": 4, "b": 5},
		3:  {"solo": 6},
		15: {"日本": 7, "Z": 8, "ä": 9},
	}
	standIn, prefix := startBillingStandIn(t, func(partition int, command map[string]interface{}) interface{} {
		usage, more := byUTF8(listed[partition], text(command["after"]), int(integer(t, command["limit"])))
		return map[string]interface{}{"status": "ok", "usage": usage, "more": more}
	})
	c := clientWithPrefix(t, prefix, nil)
	september := time.Date(2026, time.September, 1, 0, 0, 0, 0, time.UTC)
	var seen []string
	pages := 0
	err := c.Admin().UsagePages(ctx, ListUsage{Meter: "tokens", PeriodStart: september, Limit: 2, Partition: 9, After: "ignored"}, func(partition int, usage []UserUsage) error {
		pages++
		if len(usage) > 2 {
			t.Fatalf("a page of %d over the limit of 2", len(usage))
		}
		for _, u := range usage {
			seen = append(seen, fmt.Sprintf("%d:%s:%d", partition, u.User, u.Used))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"0:a:2", "0:b:5", "0:m:4", "0:z:1", "0:é:3", "3:solo:6", "15:Z:8", "15:ä:9", "15:日本:7"}
	if !reflect.DeepEqual(seen, want) || pages != testPartitions+3 {
		t.Fatalf("walked %v in %d pages, want %v in %d", seen, pages, want, testPartitions+3)
	}
	subjects, commands := standIn.sent()
	var afters []string
	for i, command := range commands {
		if subjects[i] == prefix+".v1.0.admin" {
			afters = append(afters, text(command["after"]))
		}
		if integer(t, command["periodStart"]) != september.UnixMilli() || command["meter"] != "tokens" || command["user"] != nil {
			t.Fatalf("command %v", command)
		}
	}
	if !reflect.DeepEqual(afters, []string{"", "b", "z"}) {
		t.Fatalf("afters in partition 0: %q", afters)
	}
}

func TestUsagePagesStopsAtARefusalAndAtTheCallersError(t *testing.T) {
	ctx := testContext(t, 20*time.Second)
	_, prefix := startBillingStandIn(t, func(partition int, command map[string]interface{}) interface{} {
		if partition == 5 {
			return map[string]interface{}{"status": "unknown_meter"}
		}
		return map[string]interface{}{"status": "ok", "usage": []interface{}{map[string]interface{}{"user": "u", "used": 1}}, "more": false}
	})
	c := clientWithPrefix(t, prefix, nil)
	var partitions []int
	err := c.Admin().UsagePages(ctx, ListUsage{Meter: "nope"}, func(partition int, _ []UserUsage) error {
		partitions = append(partitions, partition)
		return nil
	})
	var refused *UsageListRefusedError
	if !errors.As(err, &refused) || refused.Partition != 5 || refused.Result.Status != StatusUnknownMeter ||
		!strings.Contains(err.Error(), `meter "nope" on partition 5 refused: unknown_meter`) {
		t.Fatalf("want a UsageListRefusedError at partition 5, got %v", err)
	}
	if !reflect.DeepEqual(partitions, []int{0, 1, 2, 3, 4}) {
		t.Fatalf("pages before the refusal: %v", partitions)
	}
	stop := errors.New("enough")
	if err := c.Admin().UsagePages(ctx, ListUsage{Meter: "tokens"}, func(int, []UserUsage) error { return stop }); !errors.Is(err, stop) {
		t.Fatalf("the caller's error: %v", err)
	}
	if _, err := c.Admin().ListUsage(ctx, ListUsage{Partition: testPartitions, Meter: "tokens"}); err == nil ||
		!strings.Contains(err.Error(), "partition must be 0 to 15") {
		t.Fatalf("a partition out of range: %v", err)
	}
}

// Against the coordinator TestMain started (revision 1.3's server side): usage_history, list_usage
// with paging over non-ASCII users, a none meter, unknown_meter, and usage_recorded through Events.
func TestBillingAgainstTheCoordinator(t *testing.T) {
	ctx := testContext(t, 60*time.Second)
	h := newOps(t, ctx, testClient)
	admin := testClient.Admin()
	label := randomHex(4)
	// Users of one partition, non-ASCII among them, so paging crosses pages within it.
	users := map[string]int64{}
	partition := -1
	for i := 0; len(users) < 5; i++ {
		user := fmt.Sprintf("bill-%s-%d-%s", label, i, []string{"é", "日本", "a", "Z", "ü"}[i%5])
		if partition == -1 {
			partition = Partition(user, testPartitions)
		}
		if Partition(user, testPartitions) == partition {
			users[user] = int64(10 + len(users))
		}
	}
	events, err := testClient.Events(ctx, EventsOptions{Kinds: []EventKind{EventUsageRecorded}, OnlyNew: true})
	if err != nil {
		t.Fatal(err)
	}
	defer events.Stop()
	for user, amount := range users {
		h.reserve(Reserve{User: user, Meter: "tokens", Amount: amount, ID: "job"})
		wantStatus(t, "commit", h.commit(Commit{User: user, ID: "job", Amount: Int64(amount)}).Status, StatusCommitted)
	}
	var someone string
	for user := range users {
		someone = user
		break
	}
	wantStatus(t, "adjust storage", h.adjust(Adjust{User: someone, Meter: "storage_bytes", Amount: 4096, ID: "upload"}).Status, StatusAdjusted)

	history, err := admin.UsageHistory(ctx, UsageHistory{User: someone, Meter: "tokens", Periods: 2})
	if err != nil || history.Status != StatusOK || len(history.History) != 1 || history.History[0].Period != PeriodMonth ||
		len(history.History[0].Periods) == 0 || history.History[0].Periods[0].Used != users[someone] {
		t.Fatalf("usage_history: %+v %v", history, err)
	}
	now := time.Now().UTC()
	month := time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC)
	if !history.History[0].Periods[0].PeriodStart.Equal(month) {
		t.Fatalf("the current period starts %v, want %v", history.History[0].Periods[0].PeriodStart, month)
	}

	found := map[string]int64{}
	var order []string
	for after := ""; ; {
		page, err := admin.ListUsage(ctx, ListUsage{Partition: partition, Meter: "tokens", PeriodStart: month, After: after, Limit: 2})
		if err != nil || page.Status != StatusOK || len(page.Usage) > 2 {
			t.Fatalf("list_usage: %+v %v", page, err)
		}
		for _, u := range page.Usage {
			if _, ours := users[u.User]; ours {
				found[u.User] = u.Used
				order = append(order, u.User)
			}
		}
		if !page.More {
			break
		}
		after = page.Usage[len(page.Usage)-1].User
	}
	if !reflect.DeepEqual(found, users) || !sort.StringsAreSorted(order) {
		t.Fatalf("list_usage found %v in order %q, want %v by UTF-8 bytes", found, order, users)
	}

	gauge, err := admin.ListUsage(ctx, ListUsage{Partition: partition, Meter: "storage_bytes"})
	if err != nil || gauge.Status != StatusOK {
		t.Fatalf("list_usage of a none meter: %+v %v", gauge, err)
	}
	if i := sort.Search(len(gauge.Usage), func(i int) bool { return gauge.Usage[i].User >= someone }); i == len(gauge.Usage) ||
		gauge.Usage[i] != (UserUsage{User: someone, Used: 4096}) {
		t.Fatalf("list_usage of storage_bytes: %+v", gauge.Usage)
	}
	unknown, err := admin.ListUsage(ctx, ListUsage{Partition: partition, Meter: "nope", PeriodStart: month})
	if err != nil || unknown.Status != StatusUnknownMeter {
		t.Fatalf("list_usage of an unknown meter: %+v %v", unknown, err)
	}

	recorded := map[string]int64{}
	for len(recorded) < len(users) {
		delivery, err := events.Next(ctx)
		if err != nil {
			t.Fatalf("waiting for usage_recorded: %v (have %v)", err, recorded)
		}
		_ = delivery.Ack()
		e := delivery.Event
		if _, ours := users[e.User]; ours && e.Meter == "tokens" {
			if e.Source != SourceCommit || e.Ref != "job" || e.PeriodStart == nil || !e.PeriodStart.Equal(month) || e.Used != e.Amount {
				t.Fatalf("usage_recorded: %+v", e)
			}
			recorded[e.User] += e.Amount
		}
	}
	if !reflect.DeepEqual(recorded, users) {
		t.Fatalf("usage_recorded amounts %v, want %v", recorded, users)
	}
}
