package quota

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Connect takes QUOTA_PREFIX from the environment and the partition count from the running service
// (issue 30 item 5); explicit Options win over the environment, and a count that disagrees with the
// service is an error naming where it came from.
func TestConnectLearnsTheDeploymentFromTheService(t *testing.T) {
	t.Setenv("NATS_URL", testNATSURL)
	t.Setenv("QUOTA_PREFIX", testPrefix)
	t.Setenv("QUOTA_PARTITIONS", "")
	c, err := Connect(Options{})
	if err != nil {
		t.Fatal(err)
	}
	got := c.Options()
	t.Logf("QUOTA_PREFIX=%s, QUOTA_PARTITIONS unset: prefix %s, %d partitions", testPrefix, got.Prefix, got.Partitions)
	if got.Prefix != testPrefix || got.Partitions != testPartitions {
		t.Fatalf("want prefix %s with the service's %d partitions, got %s with %d", testPrefix, testPartitions, got.Prefix, got.Partitions)
	}
	user := unique("connect")
	r, err := c.GetUsage(testContext(t, 10*time.Second), GetUsage{User: user})
	c.Close()
	if err != nil || r.Status != StatusOK {
		t.Fatalf("get_usage through the learned deployment: %+v %v", r, err)
	}

	for _, tc := range []struct {
		env      string
		options  Options
		variable string
	}{
		{"8", Options{}, "QUOTA_PARTITIONS"},
		{strconv.Itoa(testPartitions), Options{Partitions: 64}, "Options.Partitions"},
	} {
		t.Setenv("QUOTA_PARTITIONS", tc.env)
		_, err := Connect(tc.options)
		var settings *SettingsError
		if !errors.As(err, &settings) || settings.Variable != tc.variable || !strings.Contains(err.Error(), strconv.Itoa(testPartitions)+" partitions") {
			t.Fatalf("QUOTA_PARTITIONS=%s, Options %+v: want a SettingsError on %s naming the service's %d, got %v", tc.env, tc.options.Partitions, tc.variable, testPartitions, err)
		}
		t.Logf("%v", err)
	}

	// Nobody serves this prefix: the configured settings stand, explicit Options over the environment.
	t.Setenv("QUOTA_PARTITIONS", "16")
	c, err = Connect(Options{Prefix: "tgonobody" + randomHex(4), Partitions: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Options().Partitions != 4 {
		t.Fatalf("explicit Options.Partitions 4 lost to the environment: %d", c.Options().Partitions)
	}
}

func TestDiscover(t *testing.T) {
	d, found, err := Discover(context.Background(), testNC, testPrefix)
	if err != nil || !found || d.Partitions != testPartitions || d.Instances != 1 {
		t.Fatalf("Discover(%s): %+v found %v, %v", testPrefix, d, found, err)
	}
	if _, found, err := Discover(context.Background(), testNC, "tgonobody"+randomHex(4)); found || err != nil {
		t.Fatalf("a prefix nobody serves was found: %v", err)
	}
}

func TestSettingsFromEnv(t *testing.T) {
	env := func(values map[string]string) func(string) string { return func(k string) string { return values[k] } }
	prefix, partitions, err := SettingsFromEnv(env(map[string]string{"QUOTA_PREFIX": " billing.quota ", "QUOTA_PARTITIONS": "128"}))
	if err != nil || prefix != "billing.quota" || partitions != 128 {
		t.Fatalf("got %q %d %v", prefix, partitions, err)
	}
	for _, bad := range []map[string]string{{"QUOTA_PARTITIONS": "0"}, {"QUOTA_PARTITIONS": "65537"}, {"QUOTA_PARTITIONS": "+3"}, {"QUOTA_PREFIX": "a..b"}} {
		if _, _, err := SettingsFromEnv(env(bad)); err == nil {
			t.Errorf("%v: accepted", bad)
		}
	}
}
