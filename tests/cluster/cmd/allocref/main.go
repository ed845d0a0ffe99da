// Command allocref runs Kubernetes' own structured allocator
// (k8s.io/dynamic-resource-allocation/structured, v0.37.2) with the 1.37 default
// features on snapshots written by the dra-allocator tests, so the Rust allocator can be
// compared with the reference case by case and timed against it.
//
// Input: one JSON object per line on stdin:
//
//	{"classes": [DeviceClass], "slices": [ResourceSlice], "taintRules": [DeviceTaintRule],
//	 "allocations": [AllocationResult], "claims": [ResourceClaim], "node": Node,
//	 "nodes": [Node] (optional: allocate on each, as Filter does per node),
//	 "repeat": n (optional), "timeoutMs": n (optional, default 10000)}
//
// Output: one JSON object per input line:
//
//	{"allocated": bool, "error": "...", "timedOut": bool, "results": [AllocationResult],
//	 "micros": mean time per pod over the repeats (NewAllocator + Allocate on every node),
//	 "bestMicros": the fastest repeat, "fits": nodes that fit}
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
)

type snapshot struct {
	Classes     []resourceapi.DeviceClass      `json:"classes"`
	Slices      []resourceapi.ResourceSlice    `json:"slices"`
	TaintRules  []resourceapi.DeviceTaintRule  `json:"taintRules"`
	Allocations []resourceapi.AllocationResult `json:"allocations"`
	Claims      []resourceapi.ResourceClaim    `json:"claims"`
	Node        *v1.Node                       `json:"node"`
	Nodes       []v1.Node                      `json:"nodes"`
	Repeat      int                            `json:"repeat"`
	TimeoutMs   int                            `json:"timeoutMs"`
	// AlphaGates turns on 1.37's alpha DRA gates the allocator reads (DRAListTypeAttributes,
	// DRADerivedAttributes, DRADeviceCompatibilityGroups, DRAOptionalNodeOperations).
	AlphaGates bool `json:"alphaGates"`
}

type answer struct {
	Allocated bool                           `json:"allocated"`
	Error     string                         `json:"error,omitempty"`
	TimedOut  bool                           `json:"timedOut,omitempty"`
	Results   []resourceapi.AllocationResult `json:"results,omitempty"`
	Micros    float64                        `json:"micros"`
	Best      float64                        `json:"bestMicros"`
	Fits      int                            `json:"fits"`
}

type classLister map[string]*resourceapi.DeviceClass

func (c classLister) List() ([]*resourceapi.DeviceClass, error) {
	out := make([]*resourceapi.DeviceClass, 0, len(c))
	for _, class := range c {
		out = append(out, class)
	}
	return out, nil
}

func (c classLister) Get(name string) (*resourceapi.DeviceClass, error) {
	if class, ok := c[name]; ok {
		return class, nil
	}
	return nil, fmt.Errorf("device class %s not found", name)
}

// features are the scheduler's allocator features with Kubernetes 1.37's default gates.
var features = structured.Features{
	AdminAccess:             true,
	PrioritizedList:         true,
	PartitionableDevices:    true,
	DeviceTaints:            true,
	DeviceBindingAndStatus:  true,
	ConsumableCapacity:      true,
	FractionalCapacityRange: true,
}

// withAlphaGates is features with 1.37's alpha gates that the allocator reads on.
func withAlphaGates() structured.Features {
	f := features
	f.ListTypeAttributes = true
	f.DerivedAttributes = true
	f.CompatibilityGroups = true
	f.OptionalNodeOperations = true
	return f
}

// allocatedState gathers what the scheduler's claim tracker would: dedicated devices,
// shared device IDs and their aggregated consumed capacity. Admin access is not counted.
func allocatedState(allocations []resourceapi.AllocationResult) structured.AllocatedState {
	state := structured.AllocatedState{
		AllocatedDevices:         sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
	}
	for _, a := range allocations {
		for _, r := range a.Devices.Results {
			if r.AdminAccess != nil && *r.AdminAccess {
				continue
			}
			id := structured.MakeDeviceID(r.Driver, r.Pool, r.Device)
			if r.ShareID == nil {
				state.AllocatedDevices.Insert(id)
				continue
			}
			state.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(id, r.ShareID))
			if r.ConsumedCapacity != nil {
				state.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(id, r.ConsumedCapacity))
			}
		}
	}
	return state
}

// applyTaintRules patches slices as the scheduler's slice tracker does: a DeviceTaintRule's
// taint is added to every device its selector matches.
func applyTaintRules(slices []resourceapi.ResourceSlice, rules []resourceapi.DeviceTaintRule) []*resourceapi.ResourceSlice {
	out := make([]*resourceapi.ResourceSlice, 0, len(slices))
	for i := range slices {
		slice := slices[i].DeepCopy()
		for d := range slice.Spec.Devices {
			device := &slice.Spec.Devices[d]
			for _, rule := range rules {
				sel := rule.Spec.DeviceSelector
				if sel != nil {
					if sel.Driver != nil && *sel.Driver != slice.Spec.Driver ||
						sel.Pool != nil && *sel.Pool != slice.Spec.Pool.Name ||
						sel.Device != nil && *sel.Device != device.Name {
						continue
					}
				}
				device.Taints = append(device.Taints, rule.Spec.Taint)
			}
		}
		out = append(out, slice)
	}
	return out
}

func run(s *snapshot, celCache *cel.Cache) answer {
	classes := classLister{}
	for i := range s.Classes {
		classes[s.Classes[i].Name] = &s.Classes[i]
	}
	slices := applyTaintRules(s.Slices, s.TaintRules)
	claims := make([]*resourceapi.ResourceClaim, len(s.Claims))
	for i := range s.Claims {
		claims[i] = &s.Claims[i]
	}
	nodes := s.Nodes
	if len(nodes) == 0 && s.Node != nil {
		nodes = []v1.Node{*s.Node}
	}
	timeout := time.Duration(s.TimeoutMs) * time.Millisecond
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	repeat := max(s.Repeat, 1)
	var ans answer
	start := time.Now()
	best := time.Duration(math.MaxInt64)
	for r := 0; r < repeat; r++ {
		began := time.Now()
		ans = answer{}
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		gates := features
		if s.AlphaGates {
			gates = withAlphaGates()
		}
		allocator, err := structured.NewAllocator(ctx, gates, allocatedState(s.Allocations), classes, slices, celCache)
		if err != nil {
			cancel()
			ans.Error = err.Error()
			break
		}
		for i := range nodes {
			results, err := allocator.Allocate(ctx, &nodes[i], claims)
			if err != nil {
				if ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) {
					ans.TimedOut = true
				}
				if ans.Error == "" {
					ans.Error = err.Error()
				}
				continue
			}
			if len(results) == len(claims) {
				ans.Fits++
				if !ans.Allocated {
					ans.Allocated = true
					ans.Results = results
				}
			}
		}
		cancel()
		best = min(best, time.Since(began))
	}
	ans.Micros = float64(time.Since(start).Microseconds()) / float64(repeat)
	if best == time.Duration(math.MaxInt64) { // no repeat finished: NewAllocator failed
		best = time.Since(start)
	}
	ans.Best = float64(best.Microseconds())
	return ans
}

func main() {
	celCache := cel.NewCache(10, cel.Features{EnableConsumableCapacity: true})
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<30)
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	enc := json.NewEncoder(out)
	for in.Scan() {
		line := in.Bytes()
		if len(line) == 0 {
			continue
		}
		var s snapshot
		var ans answer
		if err := json.Unmarshal(line, &s); err != nil {
			ans.Error = "decode: " + err.Error()
		} else {
			ans = run(&s, celCache)
		}
		if err := enc.Encode(ans); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		out.Flush()
	}
	if err := in.Err(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
