package quota

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func envOf(values map[string]string) func(string) string {
	return func(name string) string { return values[name] }
}

func settingsError(t *testing.T, values map[string]string) *SettingsError {
	t.Helper()
	_, _, err := NATSOptionsFromEnv(envOf(values))
	var settings *SettingsError
	if !errors.As(err, &settings) {
		t.Fatalf("%v: want a SettingsError, got %v", values, err)
	}
	return settings
}

func TestNATSOptionsFromEnvRefusesWhatCannotMeanOneThing(t *testing.T) {
	dir := t.TempDir()
	notCreds := filepath.Join(dir, "user.creds")
	if err := os.WriteFile(notCreds, []byte("not a creds file"), 0o600); err != nil {
		t.Fatal(err)
	}
	notSeed := filepath.Join(dir, "seed.nk")
	if err := os.WriteFile(notSeed, []byte("SUAnotaseed"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		env      map[string]string
		variable string
		says     string
	}{
		{map[string]string{"NATS_USER": "svc"}, "NATS_PASSWORD", "required"},
		{map[string]string{"NATS_PASSWORD": "s3cret"}, "NATS_USER", "required"},
		{map[string]string{"NATS_USER": "svc", "NATS_PASSWORD": "s3cret", "NATS_TOKEN": "t0ken"}, "NATS_TOKEN", "one way to authenticate"},
		{map[string]string{"NATS_TOKEN": "t0ken", "NATS_CREDS": notCreds}, "NATS_CREDS", "one way to authenticate"},
		{map[string]string{"NATS_CERT": "/c.pem"}, "NATS_KEY", "go together"},
		{map[string]string{"NATS_CREDS": filepath.Join(dir, "missing.creds")}, "NATS_CREDS", "missing.creds: no such file"},
		{map[string]string{"NATS_CREDS": notCreds}, "NATS_CREDS", "is not a .creds file"},
		{map[string]string{"NATS_NKEY": notSeed}, "NATS_NKEY", "is not an nkey seed"},
		{map[string]string{"NATS_CA": dir}, "NATS_CA", "is a directory"},
		{map[string]string{"NATS_URL": "nats://svc:s3cret@host:4222, bad url"}, "NATS_URL", "nats://svc:***@host:4222"},
	} {
		err := settingsError(t, c.env)
		if err.Variable != c.variable || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%v: got %q (variable %s), want %s saying %q", c.env, err.Error(), err.Variable, c.variable, c.says)
		}
		for _, secret := range []string{"s3cret", "t0ken"} {
			if strings.Contains(err.Error(), secret) {
				t.Errorf("%v: the error shows a secret: %q", c.env, err.Error())
			}
		}
	}
}

func TestNATSOptionsFromEnvDefaultsAndOneWay(t *testing.T) {
	url, options, err := NATSOptionsFromEnv(envOf(nil))
	if err != nil || url != DefaultNATSURL || len(options) != 0 {
		t.Fatalf("empty environment: %q %d options %v", url, len(options), err)
	}
	url, options, err = NATSOptionsFromEnv(envOf(map[string]string{"NATS_URL": " nats://a:4222 , nats://b:4222 ", "NATS_USER": "svc", "NATS_PASSWORD": "pw"}))
	if err != nil || url != "nats://a:4222,nats://b:4222" || len(options) != 1 {
		t.Fatalf("servers and a user: %q %d options %v", url, len(options), err)
	}
}

// Connect reads the environment: here only NATS_URL, this machine's server without authentication.
func TestConnectReadsTheEnvironment(t *testing.T) {
	t.Setenv("NATS_URL", testNATSURL)
	c, err := Connect(testOptions())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := testContext(t, 10*time.Second)
	usage, err := c.GetUsage(ctx, GetUsage{User: unique("connect")})
	if err != nil || usage.Status != StatusOK {
		t.Fatalf("get_usage through Connect: %+v %v", usage, err)
	}
	c.Close()
	if !c.Conn().IsClosed() {
		t.Fatal("Close left the connection Connect opened")
	}
	if _, err := c.GetUsage(ctx, GetUsage{User: "u"}); !errors.Is(err, ErrClosed) {
		t.Fatalf("a call after Close: %v", err)
	}
}
