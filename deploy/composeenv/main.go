// Command composeenv writes the secrets docker-compose.yml reads, as an env
// file (`make compose-env` writes .env, which docker compose reads by
// itself and git ignores): the Postgres password; the credentials of the
// state-changing HTTP routes (API_TOKEN for orders and inventory, which the
// demo sends; PROVIDER_TOKEN, the provider's API key, which orders sends);
// a signing key for each service (orders signs what it publishes with
// ORDERS_SIGNING_KEY and inventory trusts it, and the other way round); and
// Kafka's passwords (KAFKA_ADMIN_PASSWORD, the broker's superuser; one per
// client principal kafka-init makes). No secret is in a committed file;
// each machine makes its own.
//
//	go run ./deploy/composeenv            # writes .env, unless it exists
//	go run ./deploy/composeenv -o path    # elsewhere (compose-ci: --env-file)
//	go run ./deploy/composeenv -force     # new secrets (Postgres keeps its
//	                                      # old password on its volume: down -v)
package main

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"strings"

	"github.com/outboxref/outbox-inbox/pkg/signature"
)

// Variables are the variables an env file from Write holds, in order.
var Variables = []string{"POSTGRES_PASSWORD", "API_TOKEN", "PROVIDER_TOKEN", "ORDERS_SIGNING_KEY", "INVENTORY_SIGNING_KEY",
	"KAFKA_ADMIN_PASSWORD", "ORDERS_KAFKA_PASSWORD", "INVENTORY_KAFKA_PASSWORD", "DEMO_KAFKA_PASSWORD", "DASHBOARD_KAFKA_PASSWORD"}

func main() {
	out := flag.String("o", ".env", "the env file to write")
	force := flag.Bool("force", false, "replace the file if it exists")
	flag.Parse()
	if err := Write(*out, *force); err != nil {
		fmt.Fprintln(os.Stderr, "composeenv:", err)
		os.Exit(1)
	}
	fmt.Printf("composeenv: wrote %s (%s), readable by its owner only\n", *out, strings.Join(Variables, ", "))
}

// Write writes a new env file at path, mode 0600, refusing to replace one
// unless force.
func Write(path string, force bool) error {
	body, err := Generate()
	if err != nil {
		return err
	}
	flags := os.O_WRONLY | os.O_CREATE | os.O_EXCL
	if force {
		flags = os.O_WRONLY | os.O_CREATE | os.O_TRUNC
	}
	f, err := os.OpenFile(path, flags, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("%s exists: its secrets are the ones your volumes hold; -force writes new ones", path)
	}
	if err != nil {
		return err
	}
	// A file -force replaces keeps its mode: make it its owner's alone.
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return err
	}
	if _, err := f.WriteString(body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// Generate returns an env file with new random secrets.
func Generate() (string, error) {
	password, err := random(24)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteString("# docker compose secrets, made on this machine by `make compose-env`\n")
	b.WriteString("# (deploy/composeenv). Never commit this file.\n")
	fmt.Fprintf(&b, "POSTGRES_PASSWORD=%s\n", password)
	for _, name := range []string{"API_TOKEN", "PROVIDER_TOKEN"} {
		token, err := random(24)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&b, "%s=%s\n", name, token)
	}
	for _, name := range []string{"orders", "inventory"} {
		id, err := random(6)
		if err != nil {
			return "", err
		}
		k := signature.Key{ID: name + "-" + id, Secret: make([]byte, signature.MinSecretBytes)}
		if _, err := rand.Read(k.Secret); err != nil {
			return "", err
		}
		fmt.Fprintf(&b, "%s_SIGNING_KEY=%s\n", strings.ToUpper(name), signature.FormatKey(k))
	}
	// Kafka's superuser, and a principal per client (kafka-init makes them).
	for _, name := range Variables[5:] {
		password, err := random(24)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&b, "%s=%s\n", name, password)
	}
	return b.String(), nil
}

// random returns n random bytes in hex: safe in a URL and in an env file.
func random(n int) (string, error) {
	raw := make([]byte, n)
	if _, err := rand.Read(raw); err != nil {
		return "", err
	}
	return hex.EncodeToString(raw), nil
}
