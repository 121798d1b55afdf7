// Package httpserve is what every HTTP server of the reference system puts
// in front of its routes, in every build (the failpoint build's crash routes
// included):
//
//   - timeouts: a client that sends its headers or its body slowly, or keeps
//     an idle connection open, is cut off (Timeouts);
//   - only known hosts: a request whose Host is not loopback, the address
//     the server listens on, or one of HTTP_ALLOWED_HOSTS is refused with
//     421, so a name an attacker's DNS points at 127.0.0.1 (DNS rebinding)
//     reaches nothing;
//   - no cross-site writes: net/http's CrossOriginProtection refuses a
//     state-changing request a browser marks as cross-site (Sec-Fetch-Site)
//     or whose Origin is not the Host, with 403;
//   - JSON only: a state-changing request with a body must say
//     Content-Type: application/json (415 otherwise), so no HTML form can
//     send one; a body-less POST (pay an order) needs none, and a browser
//     sending it from another site is refused by the check above;
//   - a credential for every state-changing request, when the server has a
//     token (HTTP_TOKEN): "Authorization: Bearer <token>", 401 otherwise.
//     A server whose state-changing routes listen beyond loopback must
//     have one: CheckExposure refuses to start it without.
//
// Refusals are JSON ({"error": "..."}) with the reason.
package httpserve

import (
	"cmp"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"mime"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"
)

// Timeouts bound each connection. The zero value of a field takes the
// default beside it.
type Timeouts struct {
	// ReadHeader bounds reading a request's headers. Defaults to 5s.
	ReadHeader time.Duration
	// Read bounds reading a whole request, body included. Defaults to 30s.
	Read time.Duration
	// Write bounds a response, from the end of the request's headers:
	// longer than the slowest route (a payment waits up to 30s for its
	// batch; /debug/pprof/profile runs 30s by default). A stream that must
	// outlive it (the dashboard's server-sent events) clears its deadline
	// with http.ResponseController. Defaults to 90s.
	Write time.Duration
	// Idle bounds a keep-alive connection between requests. Defaults to 2m.
	Idle time.Duration
}

// AllowedHostsEnv names the variable that adds hosts to those a server
// answers: a comma-separated list of names or name:port.
const AllowedHostsEnv = "HTTP_ALLOWED_HOSTS"

// TokenEnv names the variable that holds the token a server requires of
// every state-changing request.
const TokenEnv = "HTTP_TOKEN"

// Options configures Server.
type Options struct {
	Timeouts
	// AllowedHosts are hosts (name or name:port) answered beside loopback
	// and the listen address. Defaults to $HTTP_ALLOWED_HOSTS.
	AllowedHosts []string
	// Token, when set, is required of every state-changing request as
	// "Authorization: Bearer <token>". Defaults to $HTTP_TOKEN.
	Token string
	// OwnLogins says the handler checks its own logins and its forms'
	// tokens (the console, pkg/console): no Token is required, and HTML
	// form bodies are taken beside JSON. Hosts and cross-site requests are
	// checked as for every server.
	OwnLogins bool
}

// CheckExposure refuses a server with state-changing routes that listens
// beyond loopback (":8081", "0.0.0.0:8081", a LAN address, a name) without
// a token: anyone who can reach the port could change its state. variable
// names the setting that chose addr, for the message.
func CheckExposure(variable, addr, token string) error {
	if token != "" || Loopback(addr) {
		return nil
	}
	return fmt.Errorf("%s %q listens beyond loopback and the state-changing routes would be open to anyone who reaches it: "+
		"set %s (clients then send Authorization: Bearer <token>) or listen on 127.0.0.1", variable, addr, TokenEnv)
}

// Loopback reports whether a listen address (host:port) is on loopback
// only.
func Loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Server returns an http.Server for h, listening at addr, with the
// timeouts and h behind Guard.
func Server(addr string, h http.Handler, o Options) *http.Server {
	t := o.Timeouts
	if o.AllowedHosts == nil {
		o.AllowedHosts = HostsFromEnv()
	}
	if o.Token == "" && !o.OwnLogins {
		o.Token = strings.TrimSpace(os.Getenv(TokenEnv))
	}
	if o.Token != "" {
		h = RequireToken(o.Token, h)
	}
	return &http.Server{
		Addr:              addr,
		Handler:           guard(addr, o.AllowedHosts, h, o.OwnLogins),
		ReadHeaderTimeout: cmp.Or(t.ReadHeader, 5*time.Second),
		ReadTimeout:       cmp.Or(t.Read, 30*time.Second),
		WriteTimeout:      cmp.Or(t.Write, 90*time.Second),
		IdleTimeout:       cmp.Or(t.Idle, 2*time.Minute),
	}
}

// HostsFromEnv reads HTTP_ALLOWED_HOSTS.
func HostsFromEnv() []string {
	var hosts []string
	for _, h := range strings.Split(os.Getenv(AllowedHostsEnv), ",") {
		if h = strings.TrimSpace(h); h != "" {
			hosts = append(hosts, strings.ToLower(h))
		}
	}
	return hosts
}

// Guard returns h behind the host, cross-site and content-type checks of
// the package doc. listen is the server's listen address (its host is
// allowed unless it is unspecified, like ":8081"); allowed are more hosts.
func Guard(listen string, allowed []string, h http.Handler) http.Handler {
	return guard(listen, allowed, h, false)
}

// guard is Guard; forms also takes HTML form bodies.
func guard(listen string, allowed []string, h http.Handler, forms bool) http.Handler {
	hosts := []string{"localhost", "127.0.0.1", "::1"}
	if host, _, err := net.SplitHostPort(listen); err == nil && host != "" {
		if ip := net.ParseIP(host); ip == nil || !ip.IsUnspecified() {
			hosts = append(hosts, strings.ToLower(host))
		}
	}
	for _, a := range allowed {
		hosts = append(hosts, strings.ToLower(a))
	}
	cross := http.NewCrossOriginProtection()
	cross.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		Refuse(w, http.StatusForbidden, "cross-site request refused: a state-changing request must come from this origin, not a page of another site")
	}))
	checked := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if unsafe(r.Method) && r.ContentLength != 0 {
			mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
			if err != nil || (mt != "application/json" && !(forms && mt == "application/x-www-form-urlencoded")) {
				Refuse(w, http.StatusUnsupportedMediaType, fmt.Sprintf("Content-Type %q: this route takes application/json", clip(r.Header.Get("Content-Type"))))
				return
			}
		}
		h.ServeHTTP(w, r)
	})
	inner := cross.Handler(checked)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !known(hosts, r.Host) {
			Refuse(w, http.StatusMisdirectedRequest, fmt.Sprintf("unknown host %q: this server answers %s (add more with %s)",
				clip(r.Host), strings.Join(hosts, ", "), AllowedHostsEnv))
			return
		}
		inner.ServeHTTP(w, r)
	})
}

// RequireToken returns h behind the credential check: a state-changing
// request must carry "Authorization: Bearer <token>" (401 otherwise,
// compared in constant time); a read needs none.
func RequireToken(token string, h http.Handler) http.Handler {
	want := sha256.Sum256([]byte("Bearer " + token))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if unsafe(r.Method) {
			got := sha256.Sum256([]byte(r.Header.Get("Authorization")))
			if subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
				w.Header().Set("WWW-Authenticate", `Bearer realm="state-changing routes"`)
				reason := "no credential: a state-changing request needs Authorization: Bearer <token>"
				if r.Header.Get("Authorization") != "" {
					reason = "wrong credential: the Authorization header does not hold this server's token"
				}
				Refuse(w, http.StatusUnauthorized, reason)
				return
			}
		}
		h.ServeHTTP(w, r)
	})
}

// known reports whether host (a Host header: name or name:port) is one of
// hosts, which are names (any port) or name:port.
func known(hosts []string, host string) bool {
	host = strings.ToLower(host)
	name := host
	if n, _, err := net.SplitHostPort(host); err == nil {
		name = n
	}
	name = strings.TrimSuffix(strings.TrimPrefix(name, "["), "]")
	return slices.Contains(hosts, name) || slices.Contains(hosts, host)
}

func unsafe(method string) bool {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return false
	}
	return true
}

// Refuse writes {"error": reason} with status.
func Refuse(w http.ResponseWriter, status int, reason string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]string{"error": reason}) //nolint:errcheck
}

func clip(s string) string {
	if len(s) > 64 {
		s = s[:64] + "…"
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}
