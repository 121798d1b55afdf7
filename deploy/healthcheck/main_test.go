package main

import (
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

func TestTarget(t *testing.T) {
	for _, tc := range []struct {
		args     []string
		httpAddr string
		want     string
		wantErr  bool
	}{
		{args: []string{"http://127.0.0.1:9/x"}, want: "http://127.0.0.1:9/x"},
		{httpAddr: ":8081", want: "http://127.0.0.1:8081/readyz"},
		{httpAddr: "0.0.0.0:8082", want: "http://127.0.0.1:8082/readyz"},
		{wantErr: true},
		{httpAddr: "8081", wantErr: true},
		{args: []string{"a", "b"}, wantErr: true},
	} {
		got, err := target(tc.args, tc.httpAddr)
		if (err != nil) != tc.wantErr || got != tc.want {
			t.Errorf("target(%q, %q) = %q, %v; want %q, error %v", tc.args, tc.httpAddr, got, err, tc.want, tc.wantErr)
		}
	}
}

func TestCheck(t *testing.T) {
	var ready atomic.Bool
	ready.Store(true)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if !ready.Load() {
			http.Error(w, "consumer not running", http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	if err := check(srv.URL, time.Second); err != nil {
		t.Fatalf("ready service: %v", err)
	}
	ready.Store(false)
	if err := check(srv.URL, time.Second); err == nil {
		t.Fatal("a 503 passed the healthcheck")
	}
	srv.Close()
	if err := check(srv.URL, time.Second); err == nil {
		t.Fatal("a closed port passed the healthcheck")
	}
}
