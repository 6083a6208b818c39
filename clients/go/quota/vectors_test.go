package quota

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// vectorsFile is shared with the TypeScript client's tests (test/client/vectors.test.ts and
// partitionVectors.test.ts): both clients must agree on every status, hash and error shape.
const vectorsFile = "../../testdata/vectors.json"

// helperVector is what WithHold or WithSlot does with a status: "granted" (the work runs), or the
// error types the returned error's chain starts with (errors.As finds each).
type helperVector struct {
	Granted bool
	Go      []string `json:"go"`
}

func (h *helperVector) UnmarshalJSON(data []byte) error {
	if string(data) == `"granted"` {
		h.Granted = true
		return nil
	}
	type plain helperVector
	return json.Unmarshal(data, (*plain)(h))
}

type statusVector struct {
	Status   Status                 `json:"status"`
	Kind     string                 `json:"kind"`
	Reply    map[string]interface{} `json:"reply"`
	WithHold *helperVector          `json:"withHold"`
	WithSlot *helperVector          `json:"withSlot"`
}

type errorShapeVector struct {
	Note   string                 `json:"note"`
	Helper string                 `json:"helper"`
	Input  map[string]interface{} `json:"input"`
	Reply  map[string]interface{} `json:"reply"`
	Go     struct {
		Error  string                 `json:"error"`
		Fields map[string]interface{} `json:"fields"`
	} `json:"go"`
	MessageContains []string `json:"messageContains"`
}

// decodeVectors reads vectorsFile into file, numbers as json.Number.
func decodeVectors(t *testing.T, file interface{}) {
	t.Helper()
	data, err := os.ReadFile(vectorsFile)
	if err != nil {
		t.Fatal(err)
	}
	decoder := json.NewDecoder(bytes.NewReader(data))
	decoder.UseNumber()
	if err := decoder.Decode(file); err != nil {
		t.Fatal(err)
	}
}

func readVectors(t *testing.T) (statuses []statusVector, shapes []errorShapeVector) {
	t.Helper()
	var file struct {
		Statuses    []statusVector     `json:"statuses"`
		ErrorShapes []errorShapeVector `json:"errorShapes"`
	}
	decodeVectors(t, &file)
	return file.Statuses, file.ErrorShapes
}

// The Status constants status.go declares, read from its source.
func declaredStatuses(t *testing.T) []string {
	t.Helper()
	file, err := parser.ParseFile(token.NewFileSet(), "status.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var statuses []string
	ast.Inspect(file, func(node ast.Node) bool {
		spec, ok := node.(*ast.ValueSpec)
		if !ok || spec.Type == nil || fmt.Sprint(spec.Type) != "Status" {
			return true
		}
		for _, value := range spec.Values {
			text, err := strconv.Unquote(value.(*ast.BasicLit).Value)
			if err != nil {
				t.Fatal(err)
			}
			statuses = append(statuses, text)
		}
		return true
	})
	sort.Strings(statuses)
	return statuses
}

func TestVectorStatusesAreTheGoClientsStatuses(t *testing.T) {
	statuses, _ := readVectors(t)
	var inVectors []string
	for _, vector := range statuses {
		inVectors = append(inVectors, string(vector.Status))
	}
	sort.Strings(inVectors)
	if declared := declaredStatuses(t); !reflect.DeepEqual(inVectors, declared) {
		t.Fatalf("the vectors' statuses\n  %v\nare not status.go's\n  %v", inVectors, declared)
	}
}

// vectorCoordinator answers reserve and acquire_slot with answer, and the helpers' cleanup (commit,
// release, renew_slot, release_slot) with its success.
func vectorCoordinator(t *testing.T, answer map[string]interface{}) *Client {
	t.Helper()
	prefix, _ := fakeCoordinator(t, func(msg *nats.Msg) {
		var commands []struct {
			Op string `json:"op"`
		}
		if err := json.Unmarshal(msg.Data, &commands); err != nil {
			t.Errorf("fake coordinator: %v", err)
			return
		}
		results := make([]map[string]interface{}, len(commands))
		for i, command := range commands {
			switch command.Op {
			case "reserve", "acquire_slot":
				results[i] = answer
			case "commit":
				results[i] = map[string]interface{}{"status": "committed"}
			case "renew_slot":
				results[i] = map[string]interface{}{"status": "renewed", "limit": 2, "held": 1}
			default:
				results[i] = map[string]interface{}{"status": "released", "limit": 2, "held": 0}
			}
		}
		data, _ := json.Marshal(results)
		_ = msg.Respond(data)
	})
	return clientWithPrefix(t, prefix, func(o *Options) {
		o.Retry = RetryPolicy{BaseDelay: time.Millisecond, MaxDelay: time.Millisecond, AttemptsMax: 2}
	})
}

// errorChain: the dynamic types of err and of what it wraps, outermost first.
func errorChain(err error) (chain []error, types []string) {
	for ; err != nil; err = errors.Unwrap(err) {
		chain = append(chain, err)
		types = append(types, strings.TrimPrefix(fmt.Sprintf("%T", err), "*quota."))
	}
	return chain, types
}

func runHelper(ctx context.Context, c *Client, helper string, input map[string]interface{}) (ran bool, err error) {
	text := func(key string) string { s, _ := input[key].(string); return s }
	if helper == "withHold" {
		amount, _ := input["amount"].(json.Number).Int64()
		_, err = WithHold(ctx, c, Reserve{User: text("user"), Meter: text("meter"), Amount: amount, ID: text("id")},
			func(context.Context, ReserveResult) (int64, error) { ran = true; return 1, nil })
		return ran, err
	}
	err = WithSlot(ctx, c, SlotJob{User: text("user"), Job: text("job")}, func(context.Context) error { ran = true; return nil })
	return ran, err
}

// What WithHold and WithSlot do with every status reserve and acquire_slot may answer.
func TestVectorStatusesThroughTheHelpers(t *testing.T) {
	statuses, _ := readVectors(t)
	helpers := 0
	for _, vector := range statuses {
		for helper, want := range map[string]*helperVector{"withHold": vector.WithHold, "withSlot": vector.WithSlot} {
			if want == nil {
				continue
			}
			helpers++
			vector, want, helper := vector, want, helper
			t.Run(helper+"/"+string(vector.Status), func(t *testing.T) {
				answer := map[string]interface{}{"status": vector.Status}
				for key, value := range vector.Reply {
					answer[key] = value
				}
				c := vectorCoordinator(t, answer)
				input := map[string]interface{}{"user": "acct-42", "meter": "tokens", "amount": json.Number("5"), "id": "job-7", "job": "job-7"}
				ran, err := runHelper(testContext(t, 10*time.Second), c, helper, input)
				_, types := errorChain(err)
				if want.Granted {
					if err != nil || !ran {
						t.Fatalf("%s: want the work run, got ran %v, %v", vector.Status, ran, err)
					}
					return
				}
				if ran || len(types) < len(want.Go) || !reflect.DeepEqual(types[:len(want.Go)], want.Go) {
					t.Fatalf("%s: want an error whose chain starts %v, got ran %v, chain %v: %v", vector.Status, want.Go, ran, types, err)
				}
			})
		}
	}
	if helpers < 15 {
		t.Fatalf("only %d helper vectors", helpers)
	}
}

// The typed error each helper returns for a reply: its fields and what its message says.
func TestVectorErrorShapes(t *testing.T) {
	_, shapes := readVectors(t)
	if len(shapes) < 4 {
		t.Fatalf("only %d error shapes", len(shapes))
	}
	for _, shape := range shapes {
		shape := shape
		t.Run(shape.Note, func(t *testing.T) {
			c := vectorCoordinator(t, shape.Reply)
			ran, err := runHelper(testContext(t, 10*time.Second), c, shape.Helper, shape.Input)
			chain, types := errorChain(err)
			if ran || err == nil {
				t.Fatalf("want a %s, got ran %v, %v", shape.Go.Error, ran, err)
			}
			var typed error
			for i, name := range types {
				if name == shape.Go.Error {
					typed = chain[i]
				}
			}
			if typed == nil {
				t.Fatalf("no %s in the chain %v of %v", shape.Go.Error, types, err)
			}
			value := reflect.ValueOf(typed).Elem()
			for field, want := range shape.Go.Fields {
				got := value.FieldByName(field)
				if !got.IsValid() {
					t.Fatalf("%s has no field %s", shape.Go.Error, field)
				}
				if fmt.Sprint(got.Interface()) != fmt.Sprint(want) {
					t.Errorf("%s.%s = %v, want %v", shape.Go.Error, field, got.Interface(), want)
				}
			}
			for _, part := range shape.MessageContains {
				if !strings.Contains(err.Error(), part) {
					t.Errorf("the message %q does not contain %q", err.Error(), part)
				}
			}
		})
	}
}
