package quota

// The tests run against a real coordinator that TestMain starts: `serve` of the TypeScript project
// this module lives in (../../..), on this machine's NATS and PostgreSQL, with a database and a subject
// prefix of its own so that nobody else's tests see it, and stops it at the end (the events stream and
// the database go with it).
//
//	QUOTA_GO_TEST_SERVE  the compiled CLI (dist/src/cli/main.js after `npm run build`); unset: the
//	                     TypeScript sources through tsx (slower to start, never stale)
//	DATABASE_URL         PostgreSQL to create the test database in (default postgres://postgres@127.0.0.1:5432/test)
//	NATS_URL             NATS with JetStream (default nats://127.0.0.1:4222)

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// The deployment the tests run against.
const (
	testPartitions = 16
	// FAIRNESS_SNOOZE_DURATION and _JITTER: busy answers retryAfterMs in [2s, 3s].
	testSnoozeBase   = 2 * time.Second
	testSnoozeJitter = 1 * time.Second
)

var (
	testNATSURL string
	testPrefix  string
	// testNC is one connection the tests share; clients made on it leave it open.
	testNC *nats.Conn
	// testClient is a client of the coordinator with the test deployment's options.
	testClient *Client
)

func TestMain(m *testing.M) {
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	testNATSURL = envOr("NATS_URL", DefaultNATSURL)
	testPrefix = "tgo" + randomHex(4) // the pattern test/support/eventStreams.ts cleans up after a crash
	database, err := createTestDatabase(envOr("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "TestMain:", err)
		return 1
	}
	defer database.drop()

	serve, err := startCoordinator(database.url)
	if err != nil {
		fmt.Fprintln(os.Stderr, "TestMain:", err)
		return 1
	}
	defer serve.stop()

	testNC, err = nats.Connect(testNATSURL, nats.Name("quota-go-tests"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "TestMain: NATS:", err)
		return 1
	}
	defer testNC.Close()
	defer deleteEventsStream()
	testClient, err = New(testNC, testOptions())
	if err != nil {
		fmt.Fprintln(os.Stderr, "TestMain:", err)
		return 1
	}
	defer testClient.Close()
	code := m.Run()
	if code != 0 {
		fmt.Fprintf(os.Stderr, "coordinator output (last 4000 bytes):\n%s\n", serve.tail(4000))
	}
	return code
}

func testOptions() Options {
	return Options{Prefix: testPrefix, Partitions: testPartitions, RequestTimeout: 5 * time.Second}
}

func envOr(name, fallback string) string {
	if value := strings.TrimSpace(os.Getenv(name)); value != "" {
		return value
	}
	return fallback
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// unique is a name no other test (or run) uses.
func unique(label string) string { return label + "-" + randomHex(6) }

type testDatabase struct {
	adminURL string
	name     string
	url      string
}

// createTestDatabase: serve uses the schema `quota` of its database, so the tests get a database of
// their own, as test/support/processes.ts does for the TypeScript process tests.
func createTestDatabase(adminURL string) (*testDatabase, error) {
	name := "qc_go_" + randomHex(5)
	if out, err := exec.Command("psql", adminURL, "-v", "ON_ERROR_STOP=1", "-qc", `create database "`+name+`"`).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("creating database %s with psql: %v: %s", name, err, out)
	}
	parsed, err := url.Parse(adminURL)
	if err != nil {
		return nil, err
	}
	parsed.Path = "/" + name
	return &testDatabase{adminURL: adminURL, name: name, url: parsed.String()}, nil
}

func (d *testDatabase) drop() {
	if out, err := exec.Command("psql", d.adminURL, "-qc", `drop database if exists "`+d.name+`" with (force)`).CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "dropping database %s: %v: %s\n", d.name, err, out)
	}
}

type coordinator struct {
	cmd    *exec.Cmd
	mu     sync.Mutex
	output bytes.Buffer
	ready  chan struct{}
	once   sync.Once
	exited chan struct{}
}

func (c *coordinator) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.output.Write(p)
	if bytes.Contains(c.output.Bytes(), []byte(`"msg":"claimed partitions"`)) {
		c.once.Do(func() { close(c.ready) })
	}
	return len(p), nil
}

func (c *coordinator) tail(n int) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.output.Bytes()
	if len(out) > n {
		out = out[len(out)-n:]
	}
	return string(out)
}

func startCoordinator(databaseURL string) (*coordinator, error) {
	root, err := filepath.Abs("../../..")
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(root, "package.json")); err != nil {
		return nil, fmt.Errorf("the TypeScript project is not at %s: %v", root, err)
	}
	args := []string{"--import", "tsx", "src/cli/main.ts", "serve"}
	if compiled := os.Getenv("QUOTA_GO_TEST_SERVE"); compiled != "" {
		args = []string{compiled, "serve"}
	}
	c := &coordinator{ready: make(chan struct{}), exited: make(chan struct{})}
	c.cmd = exec.Command("node", args...)
	c.cmd.Dir = root
	c.cmd.Env = append(os.Environ(),
		"DATABASE_URL="+databaseURL,
		"NATS_URL="+testNATSURL,
		"QUOTA_PREFIX="+testPrefix,
		fmt.Sprintf("QUOTA_PARTITIONS=%d", testPartitions),
		"QUOTA_HTTP_ADDR=off",
		// JetStream reserves a stream's size cap while it exists; the 1 GiB default exhausts it here.
		"QUOTA_EVENTS_MAX_BYTES=16777216",
		"FAIRNESS_SNOOZE_DURATION=2s",
		"FAIRNESS_SNOOZE_JITTER=1s",
		"LOG_LEVEL=info",
	)
	c.cmd.Stdout, c.cmd.Stderr = c, c
	// If this process dies without stopping it (a panic, go test's -timeout), the coordinator goes too.
	stopWithParent(c.cmd)
	if err := c.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting the coordinator: %w", err)
	}
	go func() {
		_ = c.cmd.Wait()
		close(c.exited)
	}()
	select {
	case <-c.ready:
		return c, nil
	case <-c.exited:
		return nil, fmt.Errorf("the coordinator exited before serving:\n%s", c.tail(4000))
	case <-time.After(60 * time.Second):
		c.stop()
		return nil, fmt.Errorf("the coordinator did not serve within 60s:\n%s", c.tail(4000))
	}
}

// stop: SIGTERM (serve drains and exits 0), SIGKILL after 15s.
func (c *coordinator) stop() {
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.exited:
	case <-time.After(15 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.exited
	}
}

func deleteEventsStream() {
	js, err := testNC.JetStream()
	if err == nil {
		err = js.DeleteStream(EventsStreamName(testPrefix))
	}
	if err != nil && err != nats.ErrStreamNotFound {
		fmt.Fprintf(os.Stderr, "deleting stream %s: %v\n", EventsStreamName(testPrefix), err)
	}
}

// testContext: a deadline for one test's calls.
func testContext(t *testing.T, timeout time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	return ctx
}
