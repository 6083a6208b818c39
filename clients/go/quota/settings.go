package quota

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// The deployment's settings: QUOTA_PREFIX and QUOTA_PARTITIONS, read as the coordinator reads them
// (src/config/settings.ts), and what the running coordinators say of themselves in their NATS service
// discovery ($SRV.INFO, metadata `prefix` and `partitions`), so that a client cannot hash users to
// partitions the service does not serve.

const (
	// serviceName is the coordinator's NATS micro service name.
	serviceName = "quota-coordinator"
	// discoveryTimeout bounds Connect's question to the coordinators; with none answering, Connect goes
	// on with the configured (or default) settings after it.
	discoveryTimeout = time.Second
	// discoveryQuiet: once a coordinator answered, the others are waited for until none answers for this long.
	discoveryQuiet = 100 * time.Millisecond
)

// SettingsFromEnv reads QUOTA_PREFIX and QUOTA_PARTITIONS as the coordinator does: a value is trimmed
// and an empty one counts as unset (then "" and 0 are returned); QUOTA_PREFIX must be NATS subject
// tokens, QUOTA_PARTITIONS an integer from 1 to 65536. getenv nil reads the process's environment.
func SettingsFromEnv(getenv func(string) string) (prefix string, partitions int, err error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	prefix = strings.TrimSpace(getenv("QUOTA_PREFIX"))
	if prefix != "" && !prefixPattern.MatchString(prefix) {
		return "", 0, &SettingsError{Variable: "QUOTA_PREFIX", Reason: fmt.Sprintf("must be NATS subject tokens of letters, digits, _ or - separated by dots, got %q", prefix)}
	}
	if text := strings.TrimSpace(getenv("QUOTA_PARTITIONS")); text != "" {
		partitions, err = strconv.Atoi(text)
		if err != nil || strings.HasPrefix(text, "+") || partitions < 1 || partitions > partitionsMax {
			return "", 0, &SettingsError{Variable: "QUOTA_PARTITIONS", Reason: fmt.Sprintf("must be an integer from 1 to %d, got %q", partitionsMax, text)}
		}
	}
	return prefix, partitions, nil
}

// Deployment is what the coordinators of one prefix answered to $SRV.INFO.
type Deployment struct {
	Prefix     string
	Partitions int
	// Instances: how many coordinators of the prefix answered.
	Instances int
}

// Discover asks every coordinator on nc ($SRV.INFO.quota-coordinator) and returns what those serving
// prefix say: found is false when none of them answered within ctx (or a second when ctx has no
// deadline). Coordinators of one prefix that disagree on the partitions are an error.
func Discover(ctx context.Context, nc *nats.Conn, prefix string) (deployment Deployment, found bool, err error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, discoveryTimeout)
		defer cancel()
	}
	inbox := nats.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return Deployment{}, false, fmt.Errorf("quota: asking the coordinators ($SRV.INFO): %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishRequest("$SRV.INFO."+serviceName, inbox, nil); err != nil {
		return Deployment{}, false, fmt.Errorf("quota: asking the coordinators ($SRV.INFO): %w", err)
	}
	deployment.Prefix = prefix
	answered := false
	for {
		waitCtx, cancel := ctx, context.CancelFunc(func() {})
		if answered {
			waitCtx, cancel = context.WithTimeout(ctx, discoveryQuiet)
		}
		msg, err := sub.NextMsgWithContext(waitCtx)
		cancel()
		if err != nil || (len(msg.Data) == 0 && msg.Header.Get("Status") == "503") {
			// The time is up, or no responders: nobody serves $SRV.INFO here.
			return deployment, deployment.Instances > 0, nil
		}
		answered = true
		var info struct {
			ID       string            `json:"id"`
			Metadata map[string]string `json:"metadata"`
		}
		if json.Unmarshal(msg.Data, &info) != nil || info.Metadata["prefix"] != prefix {
			continue // another deployment (or another service's answer)
		}
		partitions, err := strconv.Atoi(info.Metadata["partitions"])
		if err != nil {
			continue // a coordinator too old to say
		}
		if deployment.Instances > 0 && partitions != deployment.Partitions {
			return deployment, true, &SettingsError{Variable: "QUOTA_PARTITIONS", Reason: fmt.Sprintf(
				"differs between the coordinators of prefix %q: %d and %d (instance %s): fix the deployment", prefix, deployment.Partitions, partitions, info.ID)}
		}
		deployment.Partitions = partitions
		deployment.Instances++
	}
}

// resolveDeployment fills options' Prefix and Partitions for Connect: explicit Options first, then
// QUOTA_PREFIX and QUOTA_PARTITIONS, then what the running coordinators of the prefix say; a setting
// that disagrees with them is a *SettingsError naming where it came from.
func resolveDeployment(nc *nats.Conn, options Options, getenv func(string) string) (Options, error) {
	envPrefix, envPartitions, err := SettingsFromEnv(getenv)
	if err != nil {
		return options, err
	}
	if options.Prefix == "" {
		options.Prefix = envPrefix
	}
	if options.Prefix == "" {
		options.Prefix = DefaultPrefix
	}
	source := "Options.Partitions"
	if options.Partitions == 0 && envPartitions != 0 {
		options.Partitions, source = envPartitions, "QUOTA_PARTITIONS"
	}
	if !prefixPattern.MatchString(options.Prefix) {
		return options, nil // New says what is wrong with it
	}
	deployment, found, err := Discover(context.Background(), nc, options.Prefix)
	if err != nil || !found {
		return options, err
	}
	if options.Partitions != 0 && options.Partitions != deployment.Partitions {
		return options, &SettingsError{Variable: source, Reason: fmt.Sprintf(
			"is %d, but the %d coordinator(s) of prefix %q serve %d partitions ($SRV.INFO): every user would go to the wrong subject; leave it unset to use the service's",
			options.Partitions, deployment.Instances, options.Prefix, deployment.Partitions)}
	}
	options.Partitions = deployment.Partitions
	return options, nil
}
