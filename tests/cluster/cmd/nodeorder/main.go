// Command nodeorder replays node events on kube-scheduler's own cache (k8s.io/kubernetes
// v1.37.2, pkg/scheduler/backend/cache) and prints the order of the snapshot's node list:
// the order in which a scheduling cycle examines nodes, starting at nextStartNodeIndex.
// The Rust engine's node order is compared with it (tests/node_order.rs).
//
// Input: one JSON object per line on stdin, a case:
//
//	{"steps": [{"add": Node} | {"update": Node} | {"remove": "name"} | {"snapshot": true}]}
//
// "add" and "update" are what an informer delivers (AddNode, and UpdateNode with the
// previous version this program kept); "remove" deletes the node (RemoveNode).
//
// Output: one JSON object per input line: {"snapshots": [[node names in order], ...]},
// the snapshot's list after UpdateSnapshot at each "snapshot" step, or {"error": "..."}.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	internalcache "k8s.io/kubernetes/pkg/scheduler/backend/cache"
	"k8s.io/kubernetes/pkg/scheduler/metrics"
)

type step struct {
	Add      *v1.Node `json:"add,omitempty"`
	Update   *v1.Node `json:"update,omitempty"`
	Remove   string   `json:"remove,omitempty"`
	Snapshot bool     `json:"snapshot,omitempty"`
}

type input struct {
	Steps []step `json:"steps"`
}

type output struct {
	Snapshots [][]string `json:"snapshots"`
	Error     string     `json:"error,omitempty"`
}

func replay(in input) (out output, err error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	logger := klog.FromContext(ctx)
	cache := internalcache.New(ctx, nil, false, false)
	snapshot := internalcache.NewEmptySnapshot()
	nodes := map[string]*v1.Node{}
	out.Snapshots = [][]string{}
	for i, s := range in.Steps {
		switch {
		case s.Add != nil:
			cache.AddNode(logger, s.Add)
			nodes[s.Add.Name] = s.Add
		case s.Update != nil:
			cache.UpdateNode(logger, nodes[s.Update.Name], s.Update)
			nodes[s.Update.Name] = s.Update
		case s.Remove != "":
			old, ok := nodes[s.Remove]
			if !ok {
				return out, fmt.Errorf("step %d removes %q, which was never added", i, s.Remove)
			}
			if err := cache.RemoveNode(logger, old); err != nil {
				return out, fmt.Errorf("step %d: %w", i, err)
			}
			delete(nodes, s.Remove)
		case s.Snapshot:
			if err := cache.UpdateSnapshot(logger, snapshot); err != nil {
				return out, fmt.Errorf("step %d: %w", i, err)
			}
			infos, err := snapshot.NodeInfos().List()
			if err != nil {
				return out, fmt.Errorf("step %d: %w", i, err)
			}
			names := make([]string, 0, len(infos))
			for _, info := range infos {
				names = append(names, info.Node().Name)
			}
			out.Snapshots = append(out.Snapshots, names)
		default:
			return out, fmt.Errorf("step %d does nothing", i)
		}
	}
	return out, nil
}

func main() {
	// The cache reports its size once a second to the scheduler's metrics.
	metrics.Register()
	klog.SetOutput(os.Stderr)
	klog.LogToStderr(false)
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<30)
	enc := json.NewEncoder(os.Stdout)
	for in.Scan() {
		var c input
		var out output
		if err := json.Unmarshal(in.Bytes(), &c); err != nil {
			out.Error = err.Error()
		} else if out, err = replay(c); err != nil {
			out.Error = err.Error()
		}
		if err := enc.Encode(out); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	if err := in.Err(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
