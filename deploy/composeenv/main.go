// Command composeenv writes the secrets docker-compose.yml reads, as an env
// file (`make compose-env` writes .env, which docker compose reads by
// itself and git ignores): the Postgres password; the credentials of the
// state-changing HTTP routes (API_TOKEN for orders and inventory, which the
// demo sends; PROVIDER_TOKEN, the provider's API key, which orders sends);
// a signing key for each service (orders signs what it publishes with
// ORDERS_SIGNING_KEY and inventory trusts it, and the other way round); and
// Kafka's passwords (KAFKA_ADMIN_PASSWORD, the broker's superuser; one per
// client principal kafka-init makes); and CONSOLE_PASSWORD, the services'
// consoles' operator login. No secret is in a committed file;
// each machine makes its own.
//
//	go run ./deploy/composeenv            # writes .env; an existing one is kept,
//	                                      # with what it lacks appended
//	go run ./deploy/composeenv -o path    # elsewhere (compose-ci: --env-file)
//	go run ./deploy/composeenv -force     # new secrets (Postgres keeps its
//	                                      # old password on its volume: down -v)
package main

import (
	"crypto/rand"
	"encoding/hex"

	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/compose-spec/compose-go/v2/dotenv"

	"github.com/outboxref/outbox-inbox/pkg/signature"
)

// Variables are the variables an env file from Write holds, in order.
var Variables = []string{"POSTGRES_PASSWORD", "API_TOKEN", "PROVIDER_TOKEN", "ORDERS_SIGNING_KEY", "INVENTORY_SIGNING_KEY",
	"KAFKA_ADMIN_PASSWORD", "ORDERS_KAFKA_PASSWORD", "INVENTORY_KAFKA_PASSWORD", "DEMO_KAFKA_PASSWORD", "DASHBOARD_KAFKA_PASSWORD",
	"CONSOLE_PASSWORD"}

func main() {
	out := flag.String("o", ".env", "the env file to write")
	force := flag.Bool("force", false, "replace the file if it exists, with new secrets for every variable")
	flag.Parse()
	added, err := Write(*out, *force)
	if err != nil {
		fmt.Fprintln(os.Stderr, "composeenv:", err)
		os.Exit(1)
	}
	switch {
	case len(added) == len(Variables):
		fmt.Printf("composeenv: wrote %s (%s), readable by its owner only\n", *out, strings.Join(added, ", "))
	case len(added) > 0:
		fmt.Printf("composeenv: %s kept; added what it lacked: %s\n", *out, strings.Join(added, ", "))
	default:
		fmt.Printf("composeenv: %s has every variable; nothing changed (-force writes new secrets)\n", *out)
	}
}

// Write makes path an env file with every variable, mode 0600, and returns
// the variables it wrote. A new file gets new secrets. An existing file
// keeps its values (they are the ones the volumes hold: Postgres keeps its
// first password), and the variables it lacks, from a file an older
// version wrote, are appended. force replaces the file with new secrets.
func Write(path string, force bool) ([]string, error) {
	values, err := Generate()
	if err != nil {
		return nil, err
	}
	var have map[string]string
	if _, statErr := os.Stat(path); !force && statErr == nil {
		if have, err = dotenv.Read(path); err != nil {
			return nil, fmt.Errorf("reading %s: %w", path, err)
		}
		if have == nil {
			have = map[string]string{} // a file with no variable in it
		}
	}
	var body strings.Builder
	if have != nil {
		if old, err := os.ReadFile(path); err == nil && len(old) > 0 && old[len(old)-1] != '\n' {
			body.WriteString("\n") // its last line ends before ours begin
		}
	} else {
		body.WriteString("# docker compose secrets, made on this machine by `make compose-env`\n")
		body.WriteString("# (deploy/composeenv). Never commit this file.\n")
	}
	var added []string
	for _, v := range Variables {
		if have[v] == "" {
			fmt.Fprintf(&body, "%s=%s\n", v, values[v])
			added = append(added, v)
		}
	}
	flags := os.O_WRONLY | os.O_CREATE | os.O_TRUNC
	if have != nil {
		flags = os.O_WRONLY | os.O_APPEND
	}
	f, err := os.OpenFile(path, flags, 0o600)
	if err != nil {
		return nil, err
	}
	// A file kept or replaced keeps its mode: make it its owner's alone.
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return nil, err
	}
	if len(added) > 0 {
		if _, err := f.WriteString(body.String()); err != nil {
			f.Close()
			return nil, err
		}
	}
	return added, f.Close()
}

// Generate returns new random secrets for every variable.
func Generate() (map[string]string, error) {
	values := map[string]string{}
	for _, v := range Variables {
		if name, ok := strings.CutSuffix(v, "_SIGNING_KEY"); ok {
			id, err := random(6)
			if err != nil {
				return nil, err
			}
			k := signature.Key{ID: strings.ToLower(name) + "-" + id, Secret: make([]byte, signature.MinSecretBytes)}
			if _, err := rand.Read(k.Secret); err != nil {
				return nil, err
			}
			values[v] = signature.FormatKey(k)
			continue
		}
		secret, err := random(24)
		if err != nil {
			return nil, err
		}
		values[v] = secret
	}
	return values, nil
}

// random returns n random bytes in hex: safe in a URL and in an env file.
func random(n int) (string, error) {
	raw := make([]byte, n)
	if _, err := rand.Read(raw); err != nil {
		return "", err
	}
	return hex.EncodeToString(raw), nil
}
