// The test node's sandbox (pause) program: it holds a pod's namespaces open, reaps the
// orphans that end up in its PID namespace, and exits on SIGINT or SIGTERM, as
// Kubernetes' own pause container does. Built static (CGO_ENABLED=0) so that it runs in an
// image that holds nothing else.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
