package console

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"
)

// Role is what a user may do.
type Role string

// The roles.
const (
	Viewer   Role = "viewer"   // reads every page
	Operator Role = "operator" // and retries and drops
)

// User is one login: by HTTP basic auth (Name and Secret) or by
// "Authorization: Bearer <Secret>".
type User struct {
	Name   string
	Role   Role
	Secret string
}

// MinSecretBytes is the shortest secret ParseUsers takes.
const MinSecretBytes = 16

// ParseUsers reads logins written "name:role:secret", comma-separated (the
// form of CONSOLE_USERS): role is viewer or operator, the secret at least
// MinSecretBytes long.
func ParseUsers(s string) ([]User, error) {
	var users []User
	for _, entry := range strings.Split(s, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		name, rest, ok1 := strings.Cut(entry, ":")
		role, secret, ok2 := strings.Cut(rest, ":")
		if !ok1 || !ok2 {
			return nil, errors.New("console: a login is not name:role:secret")
		}
		users = append(users, User{Name: name, Role: Role(role), Secret: secret})
	}
	return users, checkUsers(users)
}

// checkUsers refuses logins that say nothing sure: a name that is not
// printable ASCII, a role that is neither, a short secret, a name or a
// secret given twice (a bearer secret names its user alone).
func checkUsers(users []User) error {
	names, secrets := map[string]bool{}, map[string]bool{}
	for _, u := range users {
		switch {
		case u.Name == "" || strings.IndexFunc(u.Name, func(r rune) bool { return r <= ' ' || r > '~' || r == ':' }) >= 0:
			return fmt.Errorf("console: login name %q: printable ASCII without spaces or colons", clip(u.Name))
		case u.Role != Viewer && u.Role != Operator:
			return fmt.Errorf("console: login %s: role %q is neither %s nor %s", u.Name, clip(string(u.Role)), Viewer, Operator)
		case len(u.Secret) < MinSecretBytes:
			return fmt.Errorf("console: login %s: a secret of %d bytes; at least %d", u.Name, len(u.Secret), MinSecretBytes)
		case names[u.Name]:
			return fmt.Errorf("console: login %s given twice", u.Name)
		case secrets[u.Secret]:
			return fmt.Errorf("console: login %s has another login's secret", u.Name)
		}
		names[u.Name], secrets[u.Secret] = true, true
	}
	return nil
}

// LoopbackActor is who acts when the console has no logins and answers
// loopback clients only.
const LoopbackActor = "loopback"

// who returns the user a request is from: a login's, or, when there are
// none, the loopback client's (an operator). ok is false for anyone else.
func (c *Console) who(r *http.Request) (User, bool) {
	if len(c.cfg.Users) == 0 {
		return User{Name: LoopbackActor, Role: Operator}, loopbackClient(r)
	}
	name, secret, basic := r.BasicAuth()
	if !basic {
		token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok {
			return User{}, false
		}
		secret = token
	}
	var found User
	var match int
	for _, u := range c.cfg.Users { // every login compared, in constant time each
		s := sha256.Sum256([]byte(secret))
		w := sha256.Sum256([]byte(u.Secret))
		same := subtle.ConstantTimeCompare(s[:], w[:])
		if basic {
			same &= subtle.ConstantTimeCompare([]byte(name), []byte(u.Name))
		}
		if same == 1 && match == 0 {
			found, match = u, 1
		}
	}
	return found, match == 1
}

// loopbackClient reports whether r comes from this machine, and from no
// client behind it: its peer is a loopback address, it names a loopback
// host (a name an attacker's DNS points at 127.0.0.1 is refused: DNS
// rebinding), and no proxy header says it was forwarded (a reverse proxy or
// tunnel on this machine would make every client "loopback").
func loopbackClient(r *http.Request) bool {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
		return false
	}
	for _, h := range []string{"Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Real-Ip"} {
		if r.Header.Get(h) != "" {
			return false
		}
	}
	name := r.Host
	if n, _, err := net.SplitHostPort(r.Host); err == nil {
		name = n
	}
	name = strings.TrimSuffix(strings.TrimPrefix(name, "["), "]")
	if name == "localhost" {
		return true
	}
	ip := net.ParseIP(name)
	return ip != nil && ip.IsLoopback()
}

// csrfWindow is how long a form's token stays good: a form older than one
// to two windows must be reloaded.
const csrfWindow = 12 * time.Hour

// csrf is the token a form of user carries: an HMAC, under the console's
// key, of the user's name, a hash of their secret (a new secret voids the
// old tokens) and the time window. A page of another site cannot read
// it, so it cannot make the user's browser post a form that carries it.
func (c *Console) csrf(u User, at time.Time) string {
	secret := sha256.Sum256([]byte(u.Secret))
	m := hmac.New(sha256.New, c.key)
	fmt.Fprintf(m, "console form\x00%s\x00%x\x00%d", u.Name, secret, at.Unix()/int64(csrfWindow/time.Second))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

var errForged = errors.New("the form's token is not this user's, or is too old: reload the page and try again")

// checkForm refuses a state-changing request whose form does not carry a
// csrf token of u's, of this window or the one before.
func (c *Console) checkForm(r *http.Request, u User) error {
	got := []byte(r.PostFormValue("csrf"))
	now := time.Now()
	if subtle.ConstantTimeCompare(got, []byte(c.csrf(u, now))) == 1 ||
		subtle.ConstantTimeCompare(got, []byte(c.csrf(u, now.Add(-csrfWindow)))) == 1 {
		return nil
	}
	return errForged
}

func clip(s string) string {
	if len(s) > 40 {
		s = s[:40] + "…"
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}
