//go:build tools

// Package tools records the command this module builds (helm), so that `go mod tidy`
// keeps its dependencies. It is never compiled.
package tools

import (
	_ "helm.sh/helm/v3/cmd/helm"
)
