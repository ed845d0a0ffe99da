//go:build tools

// Package tools records the command this module builds (promtool), so that `go mod tidy`
// keeps its dependencies. It is never compiled.
package tools

import (
	_ "github.com/prometheus/prometheus/cmd/promtool"
)
