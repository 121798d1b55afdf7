package main

import (
	"bytes"
	"fmt"
	"html"
)

// chart draws round trips per second and p99 hop latency of each build side
// by side, as an SVG the README shows.
func chart(r Report) []byte {
	builds := []Result{r.Textbook, r.Project, r.ProjectNoDup, r.Limit}
	labels := []string{"textbook", "project", "project, dedupe off", "limit (SQL only)"}
	colors := []string{"#b0b0b0", "#2f6fb5", "#8fb3dc", "#3c9d5d"}
	maxRT := 1.0
	for _, b := range builds {
		maxRT = max(maxRT, b.RoundTripsPerS)
	}
	const w, h, left, top, barH, gap = 760, 300, 170, 50, 36, 18
	var buf bytes.Buffer
	fmt.Fprintf(&buf, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="13">`+"\n", w, h)
	fmt.Fprintf(&buf, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&buf, `<text x="%d" y="24" font-size="16" font-weight="bold">Order round trips per second (same run, %s CPUs, median of %d rounds)</text>`+"\n", left-150, html.EscapeString(r.Machine["cpus"]), r.Params.Rounds)
	for i, b := range builds {
		y := top + i*(barH+gap)
		bw := int(float64(w-left-150) * b.RoundTripsPerS / maxRT)
		fmt.Fprintf(&buf, `<text x="%d" y="%d" text-anchor="end">%s</text>`+"\n", left-10, y+barH/2+5, html.EscapeString(labels[i]))
		fmt.Fprintf(&buf, `<rect x="%d" y="%d" width="%d" height="%d" fill="%s"/>`+"\n", left, y, max(bw, 1), barH, colors[i])
		lat := fmt.Sprintf("p99 hop %.1f ms", b.HopLatencyMS.P99)
		if b.LatencySamples == 0 {
			lat = "latency not measured"
		}
		fmt.Fprintf(&buf, `<text x="%d" y="%d">%.0f/s · %s</text>`+"\n", left+max(bw, 1)+8, y+barH/2+5, b.RoundTripsPerS, lat)
	}
	fmt.Fprintf(&buf, `<text x="%d" y="%d" fill="#555">project/textbook %.2f× · project/limit %.0f%% · inbox overhead %.1f%%</text>`+"\n",
		left-150, h-14, r.Ratios["project_vs_textbook"], 100*r.Ratios["project_vs_limit"], 100*r.Ratios["inbox_overhead"])
	buf.WriteString("</svg>\n")
	return buf.Bytes()
}
