// Command promlint is `promtool check metrics` without the rest of promtool: it reads a
// Prometheus text exposition on stdin, prints each problem Prometheus' own linter
// (client_golang's promlint, the package promtool calls) finds as "metric problem", one a
// line on stderr, and exits 3 when there is any, as promtool does.
//
// Building promtool itself (github.com/prometheus/prometheus/cmd/promtool) took 7.5
// minutes here, for every service discovery Prometheus ships; promlint comes with
// client_golang, which this module already has for the control plane.
package main

import (
	"fmt"
	"os"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
)

func main() {
	problems, err := promlint.New(os.Stdin).Lint()
	if err != nil {
		fmt.Fprintln(os.Stderr, "error while linting:", err)
		os.Exit(1)
	}
	for _, p := range problems {
		fmt.Fprintln(os.Stderr, p.Metric, p.Text)
	}
	if len(problems) > 0 {
		os.Exit(3)
	}
}
