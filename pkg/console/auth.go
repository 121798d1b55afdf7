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
	seen := map[string]bool{}
	for _, entry := range strings.Split(s, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		name, rest, ok1 := strings.Cut(entry, ":")
		role, secret, ok2 := strings.Cut(rest, ":")
		u := User{Name: name, Role: Role(role), Secret: secret}
		switch {
		case !ok1 || !ok2:
			return nil, fmt.Errorf("console: a login %q is not name:role:secret", clip(name))
		case u.Name == "" || strings.IndexFunc(u.Name, func(r rune) bool { return r <= ' ' || r > '~' }) >= 0:
			return nil, fmt.Errorf("console: login name %q: printable ASCII without spaces", clip(name))
		case u.Role != Viewer && u.Role != Operator:
			return nil, fmt.Errorf("console: login %s: role %q is neither %s nor %s", u.Name, clip(role), Viewer, Operator)
		case len(u.Secret) < MinSecretBytes:
			return nil, fmt.Errorf("console: login %s: a secret of %d bytes; at least %d", u.Name, len(u.Secret), MinSecretBytes)
		case seen[u.Name]:
			return nil, fmt.Errorf("console: login %s given twice", u.Name)
		}
		seen[u.Name] = true
		users = append(users, u)
	}
	return users, nil
}

// LoopbackActor is who acts when the console has no logins and answers
// loopback clients only.
const LoopbackActor = "loopback"

// who returns the user a request is from: a login's, or, when there are
// none, the loopback client's (an operator). ok is false for anyone else.
func (c *Console) who(r *http.Request) (User, bool) {
	if len(c.cfg.Users) == 0 {
		host, _, err := net.SplitHostPort(r.RemoteAddr)
		if ip := net.ParseIP(host); err == nil && ip != nil && ip.IsLoopback() {
			return User{Name: LoopbackActor, Role: Operator}, true
		}
		return User{}, false
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

// csrf is the token a form of user carries: an HMAC of the user's name
// under the console's key. A page of another site cannot read it, so it
// cannot make the user's browser post a form that carries it.
func (c *Console) csrf(u User) string {
	m := hmac.New(sha256.New, c.key)
	m.Write([]byte("console form\x00" + u.Name))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

var errForged = errors.New("the form's token is not this user's: reload the page and try again")

// checkForm refuses a state-changing request whose form does not carry
// u's csrf token.
func (c *Console) checkForm(r *http.Request, u User) error {
	got := r.PostFormValue("csrf")
	if subtle.ConstantTimeCompare([]byte(got), []byte(c.csrf(u))) != 1 {
		return errForged
	}
	return nil
}

func clip(s string) string {
	if len(s) > 40 {
		s = s[:40] + "…"
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}
