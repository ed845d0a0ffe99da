// Command etcd is the etcd server Kubernetes 1.37 pins (go.etcd.io/etcd/server/v3),
// built from its module so tests need no downloaded binary.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
