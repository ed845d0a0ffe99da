//go:build tools

// Package tools records the containerd commands this module builds, so that
// `go mod tidy` keeps their dependencies. It is never compiled.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
