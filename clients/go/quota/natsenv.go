package quota

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"regexp"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// DefaultNATSURL is the server when NATS_URL is unset.
const DefaultNATSURL = "nats://127.0.0.1:4222"

// SettingsError: an environment variable that cannot be used, or a file it names that is missing,
// unreadable or not what the variable says. It names the variable and the path, never a secret.
type SettingsError struct {
	Variable string
	Reason   string
}

func (e *SettingsError) Error() string { return "quota: " + e.Variable + " " + e.Reason }

// NATSOptionsFromEnv reads the connection settings every part of quota-coordinator reads (PROTOCOL.md
// "Connecting and permissions", the names of the nats command-line tool) and returns the servers to
// give nats.Connect and the options for the rest:
//
//	NATS_URL                   servers, comma-separated (default nats://127.0.0.1:4222; tls:// requires
//	                           TLS; nats://user:pass@host and nats://token@host work as in the nats CLI)
//	NATS_USER, NATS_PASSWORD   a user and its password
//	NATS_TOKEN                 a token
//	NATS_CREDS                 a .creds file (user JWT and nkey seed)
//	NATS_NKEY                  a file holding an nkey seed
//	NATS_CA                    the CA that signs the server's certificate (turns TLS on)
//	NATS_CERT, NATS_KEY        a client certificate and its key, for mutual TLS
//
// At most one way to authenticate may be given (two are refused), and NATS_USER/NATS_PASSWORD and
// NATS_CERT/NATS_KEY go in pairs. Files are read now, so a bad one fails here with a *SettingsError
// naming the variable and the path. getenv nil reads the process's environment; an empty value counts
// as unset.
func NATSOptionsFromEnv(getenv func(string) string) (string, []nats.Option, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	value := func(name string) string { return strings.TrimSpace(getenv(name)) }
	url := value("NATS_URL")
	if url == "" {
		url = DefaultNATSURL
	}
	servers := strings.Split(url, ",")
	for index, server := range servers {
		servers[index] = strings.TrimSpace(server)
		if servers[index] == "" || strings.ContainsAny(servers[index], " \t\n") {
			return "", nil, &SettingsError{Variable: "NATS_URL", Reason: fmt.Sprintf("must be a server URL or a comma-separated list of them, got %q", redactURLs(url))}
		}
	}
	user, password, token := value("NATS_USER"), value("NATS_PASSWORD"), value("NATS_TOKEN")
	creds, nkeyFile := value("NATS_CREDS"), value("NATS_NKEY")
	caFile, certFile, keyFile := value("NATS_CA"), value("NATS_CERT"), value("NATS_KEY")

	switch {
	case user != "" && password == "":
		return "", nil, &SettingsError{Variable: "NATS_PASSWORD", Reason: "is required with NATS_USER"}
	case password != "" && user == "":
		return "", nil, &SettingsError{Variable: "NATS_USER", Reason: "is required with NATS_PASSWORD"}
	case (certFile == "") != (keyFile == ""):
		missing := "NATS_CERT"
		if keyFile == "" {
			missing = "NATS_KEY"
		}
		return "", nil, &SettingsError{Variable: missing, Reason: "is required: NATS_CERT and NATS_KEY go together"}
	}
	var ways []string
	for _, way := range []struct{ name, value string }{
		{"NATS_USER/NATS_PASSWORD", user}, {"NATS_TOKEN", token}, {"NATS_CREDS", creds}, {"NATS_NKEY", nkeyFile},
	} {
		if way.value != "" {
			ways = append(ways, way.name)
		}
	}
	if len(ways) > 1 {
		return "", nil, &SettingsError{Variable: ways[1], Reason: "refused: give one way to authenticate, not " + strings.Join(ways, " and ")}
	}

	var options []nats.Option
	switch {
	case user != "":
		options = append(options, nats.UserInfo(user, password))
	case token != "":
		options = append(options, nats.Token(token))
	case creds != "":
		contents, err := readNamedFile("NATS_CREDS", creds)
		if err != nil {
			return "", nil, err
		}
		if _, err := nkeys.ParseDecoratedJWT(contents); err != nil {
			return "", nil, &SettingsError{Variable: "NATS_CREDS", Reason: creds + " is not a .creds file (a user JWT and an nkey seed): " + err.Error()}
		}
		if _, err := nkeys.ParseDecoratedNKey(contents); err != nil {
			return "", nil, &SettingsError{Variable: "NATS_CREDS", Reason: creds + " is not a .creds file (a user JWT and an nkey seed): " + err.Error()}
		}
		options = append(options, nats.UserCredentials(creds))
	case nkeyFile != "":
		if _, err := readNamedFile("NATS_NKEY", nkeyFile); err != nil {
			return "", nil, err
		}
		option, err := nats.NkeyOptionFromSeed(nkeyFile)
		if err != nil {
			return "", nil, &SettingsError{Variable: "NATS_NKEY", Reason: nkeyFile + " is not an nkey seed file: " + firstLine(err.Error())}
		}
		options = append(options, option)
	}
	if caFile != "" {
		if _, err := readNamedFile("NATS_CA", caFile); err != nil {
			return "", nil, err
		}
		options = append(options, nats.RootCAs(caFile))
	}
	if certFile != "" {
		for _, file := range []struct{ variable, path string }{{"NATS_CERT", certFile}, {"NATS_KEY", keyFile}} {
			if _, err := readNamedFile(file.variable, file.path); err != nil {
				return "", nil, err
			}
		}
		if _, err := tls.LoadX509KeyPair(certFile, keyFile); err != nil {
			return "", nil, &SettingsError{Variable: "NATS_CERT", Reason: certFile + " and " + keyFile + " are not a certificate and its key: " + err.Error()}
		}
		options = append(options, nats.ClientCert(certFile, keyFile))
	}
	return strings.Join(servers, ","), options, nil
}

func readNamedFile(variable, path string) ([]byte, error) {
	contents, err := os.ReadFile(path)
	if err == nil {
		return contents, nil
	}
	why := err.Error()
	switch {
	case errors.Is(err, fs.ErrNotExist):
		why = "no such file"
	case errors.Is(err, fs.ErrPermission):
		why = "permission denied"
	default:
		if info, statErr := os.Stat(path); statErr == nil && info.IsDir() {
			why = "is a directory"
		}
	}
	return nil, &SettingsError{Variable: variable, Reason: "cannot read " + path + ": " + why}
}

func firstLine(text string) string {
	if line, _, found := strings.Cut(text, "\n"); found {
		return line
	}
	return text
}

var userInfoPattern = regexp.MustCompile(`^([A-Za-z][A-Za-z0-9+.-]*://)([^@/?#]*)@`)

// redactURLs: the servers with a password (or a token in the user part) replaced by ***, for errors.
func redactURLs(urls string) string {
	parts := strings.Split(urls, ",")
	for index, part := range parts {
		parts[index] = userInfoPattern.ReplaceAllStringFunc(strings.TrimSpace(part), func(match string) string {
			groups := userInfoPattern.FindStringSubmatch(match)
			if user, _, hasPassword := strings.Cut(groups[2], ":"); hasPassword {
				return groups[1] + user + ":***@"
			}
			return groups[1] + "***@"
		})
	}
	return strings.Join(parts, ",")
}
