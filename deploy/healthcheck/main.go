// Command healthcheck is the container healthcheck of the service images.
// The final images are FROM scratch, with no shell, curl or wget, so the
// image ships this small static binary beside the service:
//
//	healthcheck http://127.0.0.1:8081/readyz
//
// It GETs the URL (by default http://127.0.0.1:<port of $HTTP_ADDR>/readyz,
// the same variable the service reads) and exits 0 on a 2xx answer, 1
// otherwise, printing why. Docker runs it inside the service's container, so
// 127.0.0.1 is the service itself.
package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"
)

func main() {
	url, err := target(os.Args[1:], os.Getenv("HTTP_ADDR"))
	if err == nil {
		err = check(url, 3*time.Second)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "healthcheck:", err)
		os.Exit(1)
	}
}

// target is the URL to check: the argument when given, else /readyz on
// the port of httpAddr (":8081", "0.0.0.0:8081").
func target(args []string, httpAddr string) (string, error) {
	switch {
	case len(args) > 1:
		return "", fmt.Errorf("usage: healthcheck [URL]")
	case len(args) == 1:
		return args[0], nil
	case strings.TrimSpace(httpAddr) == "":
		return "", fmt.Errorf("no URL given and HTTP_ADDR is not set")
	}
	_, port, err := net.SplitHostPort(strings.TrimSpace(httpAddr))
	if err != nil {
		return "", fmt.Errorf("HTTP_ADDR=%q: %w", httpAddr, err)
	}
	return "http://127.0.0.1:" + port + "/readyz", nil
}

func check(url string, timeout time.Duration) error {
	client := &http.Client{Timeout: timeout}
	resp, err := client.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("GET %s: %s: %s", url, resp.Status, strings.TrimSpace(string(body)))
	}
	return nil
}
