package main

import (
	"bytes"
	"fmt"
	"html"
)

// chart draws round trips per second and p99 hop latency of each build side
// by side, as an SVG the README shows: the builds on kfake, the limit, and
// the builds on real Kafka when they ran.
func chart(r Report) []byte {
	builds := []Result{r.Textbook, r.Project, r.ProjectNoDup, r.Limit}
	labels := []string{"textbook", "project", "project, dedupe off", "limit (SQL only)"}
	colors := []string{"#b0b0b0", "#2f6fb5", "#8fb3dc", "#3c9d5d"}
	if k := r.RealKafka; k != nil {
		builds = append(builds, k.Textbook, k.Project, k.ProjectNoDup)
		labels = append(labels, "textbook, Apache Kafka", "project, Apache Kafka", "dedupe off, Apache Kafka")
		colors = append(colors, "#8a8a8a", "#1d4f8a", "#6f95c4")
	}
	if r.RealKafka != nil {
		for i := range 3 {
			labels[i] += ", kfake"
		}
	}
	maxRT := 1.0
	for _, b := range builds {
		maxRT = max(maxRT, b.RoundTripsPerS)
	}
	const w, left, top, barH, gap = 820, 200, 50, 36, 18
	h := top + len(builds)*(barH+gap) + 40
	var buf bytes.Buffer
	fmt.Fprintf(&buf, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="13">`+"\n", w, h)
	fmt.Fprintf(&buf, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&buf, `<text x="%d" y="24" font-size="16" font-weight="bold">Order round trips per second (same run, %s CPUs, median of %d rounds)</text>`+"\n", left-180, html.EscapeString(r.Machine["cpus"]), r.Params.Rounds)
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
	footer := fmt.Sprintf("kfake: project/textbook %.2f× · project/limit %.0f%% · inbox overhead %.1f%%",
		r.Ratios["project_vs_textbook"], 100*r.Ratios["project_vs_limit"], 100*r.Ratios["inbox_overhead"])
	if k := r.RealKafka; k != nil {
		footer += fmt.Sprintf("   Apache Kafka: %.2f× · %.0f%% · %.1f%%",
			k.Ratios["project_vs_textbook"], 100*k.Ratios["project_vs_limit"], 100*k.Ratios["inbox_overhead"])
	}
	fmt.Fprintf(&buf, `<text x="%d" y="%d" fill="#555">%s</text>`+"\n", left-180, h-14, html.EscapeString(footer))
	buf.WriteString("</svg>\n")
	return buf.Bytes()
}
