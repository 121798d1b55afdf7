package httpserve_test

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/services/runtime/httpserve"
)

// serve starts Server on a loopback port with t's timeouts and returns its
// address.
func serve(t *testing.T, timeouts httpserve.Timeouts) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		w.Write([]byte("ok")) //nolint:errcheck
	})
	srv := httpserve.Server(ln.Addr().String(), h, httpserve.Options{Timeouts: timeouts, AllowedHosts: []string{"orders"}})
	go srv.Serve(ln) //nolint:errcheck
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// closedWithin reports whether the server closes conn within d.
func closedWithin(conn net.Conn, d time.Duration) bool {
	conn.SetReadDeadline(time.Now().Add(d)) //nolint:errcheck
	_, err := io.Copy(io.Discard, conn)
	var ne net.Error
	return err == nil || !(errors.As(err, &ne) && ne.Timeout()) // EOF or reset: closed; a timeout: still open
}

// TestSlowClientsCutOff: a client that sends its headers and then trickles
// its body, one that never finishes its headers, and an idle keep-alive
// connection are each closed by the server, instead of holding a
// connection (and a goroutine) for as long as they like.
func TestSlowClientsCutOff(t *testing.T) {
	t.Parallel()
	addr := serve(t, httpserve.Timeouts{ReadHeader: 300 * time.Millisecond, Read: 500 * time.Millisecond, Idle: 500 * time.Millisecond})

	t.Run("TricklingBody", func(t *testing.T) {
		t.Parallel()
		conn, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		defer conn.Close()
		_, err = conn.Write([]byte("POST / HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"))
		require.NoError(t, err)
		stop := make(chan struct{})
		defer close(stop)
		go func() { // a byte every 100ms: never idle long, never done
			for {
				select {
				case <-stop:
					return
				case <-time.After(100 * time.Millisecond):
					if _, err := conn.Write([]byte(" ")); err != nil {
						return
					}
				}
			}
		}()
		require.True(t, closedWithin(conn, 5*time.Second), "a trickling body held its connection")
	})
	t.Run("UnfinishedHeaders", func(t *testing.T) {
		t.Parallel()
		conn, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		defer conn.Close()
		_, err = conn.Write([]byte("GET / HTTP/1.1\r\nHost: localhost\r\n"))
		require.NoError(t, err)
		require.True(t, closedWithin(conn, 5*time.Second), "unfinished headers held their connection")
	})
	t.Run("IdleKeepAlive", func(t *testing.T) {
		t.Parallel()
		conn, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		defer conn.Close()
		_, err = conn.Write([]byte("GET / HTTP/1.1\r\nHost: localhost\r\n\r\n"))
		require.NoError(t, err)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.True(t, closedWithin(conn, 5*time.Second), "an idle keep-alive connection stayed open")
	})
}

// TestGuard: the host, cross-site and content-type checks, each with its
// status and reason; what passes them reaches the handler.
func TestGuard(t *testing.T) {
	t.Parallel()
	addr := serve(t, httpserve.Timeouts{})
	cases := []struct {
		name, method, host, ctype, body string
		header                          map[string]string
		status                          int
		reason                          string
	}{
		{"Loopback", "GET", "localhost:1", "", "", nil, 200, ""},
		{"IPv6Loopback", "GET", "[::1]:8081", "", "", nil, 200, ""},
		{"AllowedName", "POST", "orders:8081", "application/json", "{}", nil, 200, ""},
		{"UnknownHost", "GET", "attacker.example", "", "", nil, 421, "unknown host"},
		{"RebindingName", "GET", "127.0.0.1.nip.io:8081", "", "", nil, 421, "unknown host"},
		{"Form", "POST", "localhost", "application/x-www-form-urlencoded", "a=b", nil, 415, "application/json"},
		{"TextPlain", "PUT", "localhost", "text/plain", "{}", nil, 415, "application/json"},
		{"NoBodyNoType", "POST", "localhost", "", "", nil, 200, ""},
		{"JSONWithCharset", "POST", "localhost", "application/json; charset=utf-8", "{}", nil, 200, ""},
		{"CrossSite", "POST", "localhost", "application/json", "{}", map[string]string{"Sec-Fetch-Site": "cross-site"}, 403, "cross-site"},
		{"OtherOrigin", "DELETE", "localhost:8081", "", "", map[string]string{"Origin": "https://attacker.example"}, 403, "cross-site"},
		{"CrossSiteRead", "GET", "localhost", "", "", map[string]string{"Sec-Fetch-Site": "cross-site"}, 200, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			req, err := http.NewRequest(c.method, "http://"+addr+"/", strings.NewReader(c.body))
			require.NoError(t, err)
			req.Host = c.host
			if c.ctype != "" {
				req.Header.Set("Content-Type", c.ctype)
			}
			for k, v := range c.header {
				req.Header.Set(k, v)
			}
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			require.Equal(t, c.status, resp.StatusCode, string(body))
			require.Contains(t, string(body), c.reason)
		})
	}
}

// TestToken: with a token, every state-changing request needs it, as a
// bearer credential: none, another, or the token without "Bearer " is
// refused with 401 and its reason; a read needs none. Without a token (the
// zero Options on loopback), nothing is asked.
func TestToken(t *testing.T) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok")) }) //nolint:errcheck
	h := httpserve.RequireToken("s3cret", ok)
	for _, c := range []struct {
		method, auth string
		code         int
		says         string
	}{
		{"POST", "", http.StatusUnauthorized, "no credential"},
		{"PUT", "Bearer wrong", http.StatusUnauthorized, "wrong credential"},
		{"DELETE", "s3cret", http.StatusUnauthorized, "wrong credential"},
		{"POST", "Bearer s3cret2", http.StatusUnauthorized, "wrong credential"},
		{"POST", "Bearer s3cret", http.StatusOK, "ok"},
		{"GET", "", http.StatusOK, "ok"},
		{"HEAD", "", http.StatusOK, ""},
	} {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(c.method, "/orders", nil)
		if c.auth != "" {
			req.Header.Set("Authorization", c.auth)
		}
		h.ServeHTTP(rec, req)
		require.Equal(t, c.code, rec.Code, "%s with %q: %s", c.method, c.auth, rec.Body)
		require.Contains(t, rec.Body.String(), c.says, "%s with %q", c.method, c.auth)
		if c.code == http.StatusUnauthorized {
			require.Contains(t, rec.Header().Get("WWW-Authenticate"), "Bearer")
		}
	}

	// Server takes it from HTTP_TOKEN.
	t.Setenv(httpserve.TokenEnv, "from-env")
	srv := httpserve.Server("127.0.0.1:0", ok, httpserve.Options{})
	rec := httptest.NewRecorder()
	srv.Handler.ServeHTTP(rec, httptest.NewRequest("POST", "http://127.0.0.1/orders", nil))
	require.Equal(t, http.StatusUnauthorized, rec.Code, "HTTP_TOKEN set: a POST without it")
	t.Setenv(httpserve.TokenEnv, "")
	srv = httpserve.Server("127.0.0.1:0", ok, httpserve.Options{})
	rec = httptest.NewRecorder()
	srv.Handler.ServeHTTP(rec, httptest.NewRequest("POST", "http://127.0.0.1/orders", nil))
	require.Equal(t, http.StatusOK, rec.Code, "no token, loopback: nothing asked")
}

// TestCheckExposure: a server with state-changing routes starts beyond
// loopback only with a token.
func TestCheckExposure(t *testing.T) {
	for addr, loopback := range map[string]bool{
		"127.0.0.1:8081": true, "localhost:8081": true, "[::1]:8081": true, "127.0.0.2:1": true,
		":8081": false, "0.0.0.0:8081": false, "[::]:8081": false, "10.1.2.3:8081": false, "orders:8081": false, "8081": false,
	} {
		err := httpserve.CheckExposure("HTTP_ADDR", addr, "")
		if loopback {
			require.NoError(t, err, addr)
		} else {
			require.ErrorContains(t, err, "HTTP_TOKEN", addr)
			require.ErrorContains(t, err, "listens beyond loopback", addr)
		}
		require.NoError(t, httpserve.CheckExposure("HTTP_ADDR", addr, "token"), addr)
	}
}

// TestOwnLogins: a server whose handler checks its own logins (the console)
// takes HTML form bodies and asks for no HTTP_TOKEN; every other server
// refuses a form (415) and, with HTTP_TOKEN set, a post without it (401).
// Hosts and cross-site posts are checked for both.
func TestOwnLogins(t *testing.T) {
	t.Setenv(httpserve.TokenEnv, "from-env")
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok")) }) //nolint:errcheck
	form := func(host string, headers map[string]string) *http.Request {
		req := httptest.NewRequest("POST", "http://"+host+"/bulk/start", strings.NewReader("csrf=x&expect=3"))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		for k, v := range headers {
			req.Header.Set(k, v)
		}
		return req
	}
	code := func(srv *http.Server, req *http.Request) int {
		rec := httptest.NewRecorder()
		srv.Handler.ServeHTTP(rec, req)
		return rec.Code
	}
	own := httpserve.Server("127.0.0.1:0", ok, httpserve.Options{OwnLogins: true})
	api := httpserve.Server("127.0.0.1:0", ok, httpserve.Options{})
	require.Equal(t, http.StatusOK, code(own, form("127.0.0.1", nil)), "a form, no HTTP_TOKEN asked")
	require.Equal(t, http.StatusUnsupportedMediaType, code(api, form("127.0.0.1", map[string]string{"Authorization": "Bearer from-env"})), "a form")
	require.Equal(t, http.StatusUnauthorized, code(api, form("127.0.0.1", map[string]string{"Content-Type": "application/json"})), "HTTP_TOKEN set: a post without it")
	require.Equal(t, http.StatusMisdirectedRequest, code(own, form("evil.example", nil)), "an unknown host")
	require.Equal(t, http.StatusForbidden, code(own, form("127.0.0.1", map[string]string{"Sec-Fetch-Site": "cross-site"})), "a cross-site post")
	multipart := form("127.0.0.1", map[string]string{"Content-Type": "multipart/form-data; boundary=x"})
	require.Equal(t, http.StatusUnsupportedMediaType, code(own, multipart), "forms are urlencoded")
}
