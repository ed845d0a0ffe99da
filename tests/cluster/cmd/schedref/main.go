// Command schedref runs kube-scheduler's own framework (k8s.io/kubernetes v1.37.2,
// pkg/scheduler/framework/runtime with the in-tree plugin registry and the 1.37 default
// feature gates) on clusters written by the scheduler conformance test, so the Rust engine's
// filters and scores can be compared with kube-scheduler's pod by pod.
//
// Each pending pod is evaluated on its own against the same cluster (nothing is assumed
// between pods), as one scheduling cycle up to the choice of a node: PreFilter, Filter on
// every node (nodes outside a PreFilterResult are infeasible), then PreScore and Score
// (normalised and weighted) on the feasible nodes. Every node is filtered and scored
// (percentageOfNodesToScore 100); nominated pods and extenders do not exist here.
//
// Input: one JSON object per line on stdin:
//
//	{"nodes": [Node], "pods": [Pod] (bound pods, spec.nodeName set, are existing load),
//	 "pending": ["namespace/name", ...] (pods of "pods" to evaluate, in this order),
//	 "namespaces": [Namespace], "persistentVolumes": [PersistentVolume],
//	 "persistentVolumeClaims": [PersistentVolumeClaim], "storageClasses": [StorageClass],
//	 "csiNodes": [CSINode], "csiDrivers": [CSIDriver],
//	 "volumeAttachments": [VolumeAttachment] (NodeVolumeLimits counts them),
//	 "resourceClaims": [ResourceClaim],
//	 "deviceClasses": [DeviceClass], "resourceSlices": [ResourceSlice],
//	 "services": [Service], "replicationControllers": [ReplicationController],
//	 "replicaSets": [ReplicaSet], "statefulSets": [StatefulSet] (what PodTopologySpread's
//	           default constraints take their selector from),
//	 "config": KubeSchedulerConfiguration (optional; a JSON object, or a string of YAML or
//	           JSON; kubescheduler.config.k8s.io/v1, defaulted as kube-scheduler does; its
//	           first profile is used. Without it: the default profile)}
//
// A pod without a namespace is in "default"; a pod or other object without a UID gets one
// made from its name, since the scheduler's caches key pods by UID.
//
// Output: one JSON object per input line, in input order:
//
//	{"pods": [{"pod": "namespace/name",
//	           "feasible": [node names, sorted],
//	           "unfit": {"node": "Plugin: reason, reason"},
//	           "scores": {"node": total weighted score},
//	           "pluginScores": {"Plugin": {"node": weighted score}},
//	           "preFilter": "the PreFilter rejection, when there is one",
//	           "error": "an internal error of the framework, when there is one"}],
//	 "error": "why the whole case could not be run (bad JSON, bad config)"}
//
// A bad case answers with "error" and the program goes on with the next line. Cases are
// decided concurrently (SCHEDREF_PARALLEL, default the number of CPUs); set SCHEDREF_LOG=1
// to let the scheduler's own logs through to stderr.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/informers"
	coreinformers "k8s.io/client-go/informers/core/v1"
	resourceinformers "k8s.io/client-go/informers/resource/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"
	resourceslicetracker "k8s.io/dynamic-resource-allocation/resourceslice/tracker"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/features"
	"k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/pkg/scheduler/apis/config/latest"
	"k8s.io/kubernetes/pkg/scheduler/apis/config/scheme"
	"k8s.io/kubernetes/pkg/scheduler/apis/config/validation"
	internalcache "k8s.io/kubernetes/pkg/scheduler/backend/cache"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	frameworkplugins "k8s.io/kubernetes/pkg/scheduler/framework/plugins"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/dynamicresources"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/nodevolumelimits"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
	"k8s.io/kubernetes/pkg/scheduler/metrics"
	"k8s.io/kubernetes/pkg/scheduler/util/assumecache"
)

type cluster struct {
	Nodes                  []v1.Node                    `json:"nodes"`
	Pods                   []v1.Pod                     `json:"pods"`
	Pending                []string                     `json:"pending"`
	Namespaces             []v1.Namespace               `json:"namespaces"`
	PersistentVolumes      []v1.PersistentVolume        `json:"persistentVolumes"`
	PersistentVolumeClaims []v1.PersistentVolumeClaim   `json:"persistentVolumeClaims"`
	StorageClasses         []storagev1.StorageClass     `json:"storageClasses"`
	CSINodes               []storagev1.CSINode          `json:"csiNodes"`
	CSIDrivers             []storagev1.CSIDriver        `json:"csiDrivers"`
	VolumeAttachments      []storagev1.VolumeAttachment `json:"volumeAttachments"`
	ResourceClaims         []resourceapi.ResourceClaim  `json:"resourceClaims"`
	DeviceClasses          []resourceapi.DeviceClass    `json:"deviceClasses"`
	ResourceSlices         []resourceapi.ResourceSlice  `json:"resourceSlices"`
	Services               []v1.Service                 `json:"services"`
	ReplicationControllers []v1.ReplicationController   `json:"replicationControllers"`
	ReplicaSets            []appsv1.ReplicaSet          `json:"replicaSets"`
	StatefulSets           []appsv1.StatefulSet         `json:"statefulSets"`
	Config                 json.RawMessage              `json:"config"`
}

type podAnswer struct {
	Pod          string                      `json:"pod"`
	Feasible     []string                    `json:"feasible"`
	Unfit        map[string]string           `json:"unfit"`
	Scores       map[string]int64            `json:"scores"`
	PluginScores map[string]map[string]int64 `json:"pluginScores"`
	PreFilter    string                      `json:"preFilter,omitempty"`
	Error        string                      `json:"error,omitempty"`
}

type answer struct {
	Pods  []podAnswer `json:"pods"`
	Error string      `json:"error,omitempty"`
}

// profileFor returns the profile a case runs with: the first of its own configuration, or
// the default one. Both are defaulted and validated as kube-scheduler does on start.
func profileFor(raw json.RawMessage) (*config.KubeSchedulerProfile, error) {
	var cfg *config.KubeSchedulerConfiguration
	text := strings.TrimSpace(string(raw))
	if text == "" || text == "null" {
		def, err := latest.Default()
		if err != nil {
			return nil, fmt.Errorf("default configuration: %w", err)
		}
		cfg = def
	} else {
		data := []byte(text)
		if strings.HasPrefix(text, "\"") { // a string holding YAML or JSON
			var s string
			if err := json.Unmarshal(data, &s); err != nil {
				return nil, fmt.Errorf("config: %w", err)
			}
			data = []byte(s)
		}
		obj, gvk, err := scheme.Codecs.UniversalDecoder().Decode(data, nil, nil)
		if err != nil {
			return nil, fmt.Errorf("config: %w", err)
		}
		c, ok := obj.(*config.KubeSchedulerConfiguration)
		if !ok {
			return nil, fmt.Errorf("config: not a KubeSchedulerConfiguration but %s", gvk)
		}
		c.TypeMeta.APIVersion = gvk.GroupVersion().String()
		cfg = c
	}
	cfg.PercentageOfNodesToScore = ptr(int32(100))
	if err := validation.ValidateKubeSchedulerConfiguration(cfg); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	if len(cfg.Profiles) == 0 {
		return nil, errors.New("config: no profiles")
	}
	profile := cfg.Profiles[0]
	profile.PercentageOfNodesToScore = ptr(int32(100))
	return &profile, nil
}

func ptr[T any](v T) *T { return &v }

// recordingInformer notes every event handler registered on it, so that the program can
// wait until the handlers (the assume caches of VolumeBinding and DynamicResources) have
// seen every object, not only until the informer's own store is filled.
type recordingInformer struct {
	cache.SharedIndexInformer
	mu   *sync.Mutex
	regs *[]cache.ResourceEventHandlerRegistration
}

func (r recordingInformer) note(reg cache.ResourceEventHandlerRegistration, err error) (cache.ResourceEventHandlerRegistration, error) {
	if err == nil && reg != nil {
		r.mu.Lock()
		*r.regs = append(*r.regs, reg)
		r.mu.Unlock()
	}
	return reg, err
}

func (r recordingInformer) AddEventHandler(h cache.ResourceEventHandler) (cache.ResourceEventHandlerRegistration, error) {
	return r.note(r.SharedIndexInformer.AddEventHandler(h))
}

func (r recordingInformer) AddEventHandlerWithResyncPeriod(h cache.ResourceEventHandler, d time.Duration) (cache.ResourceEventHandlerRegistration, error) {
	return r.note(r.SharedIndexInformer.AddEventHandlerWithResyncPeriod(h, d))
}

func (r recordingInformer) AddEventHandlerWithOptions(h cache.ResourceEventHandler, o cache.HandlerOptions) (cache.ResourceEventHandlerRegistration, error) {
	return r.note(r.SharedIndexInformer.AddEventHandlerWithOptions(h, o))
}

// objects lists the case's API objects for the fake clientset, with namespaces and UIDs
// filled in where the case left them out.
func (c *cluster) objects() []k8sruntime.Object {
	var objs []k8sruntime.Object
	uid := func(m *metav1.ObjectMeta, kind string) {
		if m.UID == "" {
			m.UID = types.UID(kind + "/" + m.Namespace + "/" + m.Name)
		}
	}
	for i := range c.Namespaces {
		uid(&c.Namespaces[i].ObjectMeta, "namespace")
		objs = append(objs, &c.Namespaces[i])
	}
	for i := range c.Nodes {
		uid(&c.Nodes[i].ObjectMeta, "node")
		objs = append(objs, &c.Nodes[i])
	}
	for i := range c.Pods {
		if c.Pods[i].Namespace == "" {
			c.Pods[i].Namespace = metav1.NamespaceDefault
		}
		uid(&c.Pods[i].ObjectMeta, "pod")
		objs = append(objs, &c.Pods[i])
	}
	for i := range c.PersistentVolumes {
		uid(&c.PersistentVolumes[i].ObjectMeta, "pv")
		objs = append(objs, &c.PersistentVolumes[i])
	}
	for i := range c.PersistentVolumeClaims {
		if c.PersistentVolumeClaims[i].Namespace == "" {
			c.PersistentVolumeClaims[i].Namespace = metav1.NamespaceDefault
		}
		uid(&c.PersistentVolumeClaims[i].ObjectMeta, "pvc")
		objs = append(objs, &c.PersistentVolumeClaims[i])
	}
	for i := range c.StorageClasses {
		objs = append(objs, &c.StorageClasses[i])
	}
	for i := range c.CSINodes {
		objs = append(objs, &c.CSINodes[i])
	}
	for i := range c.CSIDrivers {
		objs = append(objs, &c.CSIDrivers[i])
	}
	// The fake clientset serves them to the VolumeAttachment informer that NodeVolumeLimits
	// starts (and indexes by node) from the informer factory.
	for i := range c.VolumeAttachments {
		objs = append(objs, &c.VolumeAttachments[i])
	}
	for i := range c.ResourceClaims {
		if c.ResourceClaims[i].Namespace == "" {
			c.ResourceClaims[i].Namespace = metav1.NamespaceDefault
		}
		uid(&c.ResourceClaims[i].ObjectMeta, "claim")
		objs = append(objs, &c.ResourceClaims[i])
	}
	for i := range c.DeviceClasses {
		objs = append(objs, &c.DeviceClasses[i])
	}
	for i := range c.ResourceSlices {
		objs = append(objs, &c.ResourceSlices[i])
	}
	// Served by the fake clientset like the rest; PodTopologySpread lists them through the
	// informer factory's Services, ReplicationControllers, ReplicaSets and StatefulSets.
	namespaced := func(m *metav1.ObjectMeta, kind string) {
		if m.Namespace == "" {
			m.Namespace = metav1.NamespaceDefault
		}
		uid(m, kind)
	}
	for i := range c.Services {
		namespaced(&c.Services[i].ObjectMeta, "service")
		objs = append(objs, &c.Services[i])
	}
	for i := range c.ReplicationControllers {
		namespaced(&c.ReplicationControllers[i].ObjectMeta, "rc")
		objs = append(objs, &c.ReplicationControllers[i])
	}
	for i := range c.ReplicaSets {
		namespaced(&c.ReplicaSets[i].ObjectMeta, "rs")
		objs = append(objs, &c.ReplicaSets[i])
	}
	for i := range c.StatefulSets {
		namespaced(&c.StatefulSets[i].ObjectMeta, "ss")
		objs = append(objs, &c.StatefulSets[i])
	}
	return objs
}

// run decides one case. A panic in the framework (a malformed object it did not expect)
// becomes the case's error.
func run(line []byte, registry frameworkruntime.Registry) (ans answer) {
	defer func() {
		if r := recover(); r != nil {
			ans = answer{Error: fmt.Sprintf("panic: %v", r)}
			if os.Getenv("SCHEDREF_LOG") != "" {
				fmt.Fprintf(os.Stderr, "panic: %v\n%s", r, debug.Stack())
			}
		}
	}()
	var c cluster
	if err := json.Unmarshal(line, &c); err != nil {
		return answer{Error: "decode: " + err.Error()}
	}
	profile, err := profileFor(c.Config)
	if err != nil {
		return answer{Error: err.Error()}
	}
	objs := c.objects()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client := fake.NewClientset(objs...)
	factory := informers.NewSharedInformerFactory(client, 0)

	var mu sync.Mutex
	var regs []cache.ResourceEventHandlerRegistration
	record := func(obj k8sruntime.Object, newInformer func(kubernetes.Interface, time.Duration, cache.Indexers) cache.SharedIndexInformer) {
		factory.InformerFor(obj, func(client kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
			inner := newInformer(client, resync, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
			return recordingInformer{SharedIndexInformer: inner, mu: &mu, regs: &regs}
		})
	}
	record(&v1.PersistentVolume{}, coreinformers.NewPersistentVolumeInformer)
	record(&v1.PersistentVolumeClaim{}, func(c kubernetes.Interface, d time.Duration, i cache.Indexers) cache.SharedIndexInformer {
		return coreinformers.NewPersistentVolumeClaimInformer(c, metav1.NamespaceAll, d, i)
	})
	record(&resourceapi.ResourceClaim{}, func(c kubernetes.Interface, d time.Duration, i cache.Indexers) cache.SharedIndexInformer {
		return resourceinformers.NewResourceClaimInformer(c, metav1.NamespaceAll, d, i)
	})

	// The DRA and CSI managers, built as kube-scheduler's New builds them.
	logger := klog.FromContext(ctx)
	var draManager fwk.SharedDRAManager
	var sliceTracker *resourceslicetracker.Tracker
	if feature.DefaultFeatureGate.Enabled(features.DynamicResourceAllocation) {
		claimCache := assumecache.NewAssumeCache(logger, factory.Resource().V1().ResourceClaims().Informer(), "ResourceClaim", "", nil)
		opts := resourceslicetracker.Options{
			EnableDeviceTaintRules:   feature.DefaultFeatureGate.Enabled(features.DRADeviceTaintRules),
			EnableConsumableCapacity: feature.DefaultFeatureGate.Enabled(features.DRAConsumableCapacity),
			SliceInformer:            factory.Resource().V1().ResourceSlices(),
			KubeClient:               client,
		}
		if opts.EnableDeviceTaintRules {
			opts.TaintInformer = factory.Resource().V1().DeviceTaintRules()
		}
		sliceTracker, err = resourceslicetracker.StartTracker(ctx, opts)
		if err != nil {
			return answer{Error: "resource slice tracker: " + err.Error()}
		}
		draManager = dynamicresources.NewDRAManager(ctx, claimCache, sliceTracker, factory)
	}
	csiManager := nodevolumelimits.NewCSIManager(factory.Storage().V1().CSINodes().Lister())

	nodes := make([]*v1.Node, len(c.Nodes))
	for i := range c.Nodes {
		nodes[i] = &c.Nodes[i]
	}
	byKey := map[string]*v1.Pod{}
	var bound []*v1.Pod
	for i := range c.Pods {
		pod := &c.Pods[i]
		byKey[pod.Namespace+"/"+pod.Name] = pod
		if pod.Spec.NodeName != "" {
			bound = append(bound, pod)
		}
	}
	snapshot := internalcache.NewSnapshot(bound, nodes)

	fw, err := frameworkruntime.NewFramework(ctx, registry, profile,
		frameworkruntime.WithClientSet(client),
		frameworkruntime.WithInformerFactory(factory),
		frameworkruntime.WithSharedDRAManager(draManager),
		frameworkruntime.WithSharedCSIManager(csiManager),
		frameworkruntime.WithSnapshotSharedLister(snapshot),
		frameworkruntime.WithMutableSnapshotLister(snapshot),
		frameworkruntime.WithEventRecorder(events.NewFakeRecorder(1000)),
		frameworkruntime.WithParallelism(1),
	)
	if err != nil {
		return answer{Error: "framework: " + err.Error()}
	}

	factory.Start(ctx.Done())
	if res := factory.WaitForCacheSyncWithContext(ctx); res.Err != nil {
		return answer{Error: "informers: " + res.Err.Error()}
	}
	mu.Lock()
	checkers := make([]cache.DoneChecker, 0, len(regs)+1)
	for _, reg := range regs {
		checkers = append(checkers, reg.HasSyncedChecker())
	}
	mu.Unlock()
	if sliceTracker != nil {
		checkers = append(checkers, sliceTracker.HasSyncedChecker())
	}
	if !cache.WaitFor(ctx, "", checkers...) {
		return answer{Error: "event handlers did not sync"}
	}

	nodeInfos, err := snapshot.NodeInfos().List()
	if err != nil {
		return answer{Error: "snapshot: " + err.Error()}
	}
	ans.Pods = make([]podAnswer, 0, len(c.Pending))
	for _, key := range c.Pending {
		pod, ok := byKey[key]
		if !ok {
			ans.Pods = append(ans.Pods, podAnswer{Pod: key, Error: "no such pod in pods"})
			continue
		}
		ans.Pods = append(ans.Pods, evaluate(ctx, fw, pod.DeepCopy(), nodeInfos))
	}
	return ans
}

// reason says why a node is unfit: the plugin, then its reasons.
func reason(s *fwk.Status) string {
	msg := strings.Join(s.Reasons(), ", ")
	if err := s.AsError(); msg == "" && err != nil {
		msg = err.Error()
	}
	if s.Plugin() != "" {
		return s.Plugin() + ": " + msg
	}
	return msg
}

// evaluate runs one scheduling cycle for pod up to the choice of a node.
func evaluate(ctx context.Context, fw framework.Framework, pod *v1.Pod, nodeInfos []fwk.NodeInfo) podAnswer {
	ans := podAnswer{
		Pod:          pod.Namespace + "/" + pod.Name,
		Feasible:     []string{},
		Unfit:        map[string]string{},
		Scores:       map[string]int64{},
		PluginScores: map[string]map[string]int64{},
	}
	state := framework.NewCycleState()
	state.Write(framework.PodsToActivateKey, framework.NewPodsToActivate())

	preRes, s, plugins := fw.RunPreFilterPlugins(ctx, state, pod)
	if !s.IsSuccess() {
		if !s.IsRejected() {
			ans.Error = "PreFilter: " + s.AsError().Error()
			return ans
		}
		ans.PreFilter = reason(s)
		for _, n := range nodeInfos {
			ans.Unfit[n.Node().Name] = ans.PreFilter
		}
		return ans
	}

	var feasible []fwk.NodeInfo
	for _, n := range nodeInfos {
		name := n.Node().Name
		if !preRes.AllNodes() && !preRes.NodeNames.Has(name) {
			ans.Unfit[name] = fmt.Sprintf("node(s) didn't satisfy plugin(s) %v", sets.List(plugins))
			continue
		}
		st := fw.RunFilterPlugins(ctx, state, pod, n)
		switch {
		case st.IsSuccess():
			feasible = append(feasible, n)
			ans.Feasible = append(ans.Feasible, name)
		case st.IsRejected():
			ans.Unfit[name] = reason(st)
		default:
			ans.Error = "Filter on " + name + ": " + st.AsError().Error()
			return ans
		}
	}
	sort.Strings(ans.Feasible)
	if len(feasible) == 0 {
		return ans
	}

	if st := fw.RunPreScorePlugins(ctx, state, pod, feasible); !st.IsSuccess() {
		ans.Error = "PreScore: " + st.AsError().Error()
		return ans
	}
	scores, st := fw.RunScorePlugins(ctx, state, pod, feasible)
	if !st.IsSuccess() {
		ans.Error = "Score: " + st.AsError().Error()
		return ans
	}
	for _, node := range scores {
		ans.Scores[node.Name] = node.TotalScore
		for _, ps := range node.Scores {
			if ans.PluginScores[ps.Name] == nil {
				ans.PluginScores[ps.Name] = map[string]int64{}
			}
			ans.PluginScores[ps.Name][node.Name] = ps.Score
		}
	}
	return ans
}

func main() {
	if os.Getenv("SCHEDREF_LOG") == "" {
		flags := flag.NewFlagSet("klog", flag.ContinueOnError)
		klog.InitFlags(flags)
		_ = flags.Set("logtostderr", "false")
		_ = flags.Set("alsologtostderr", "false")
		_ = flags.Set("stderrthreshold", "FATAL")
		klog.SetOutput(io.Discard)
	}
	parallel := runtime.NumCPU()
	if v, err := strconv.Atoi(os.Getenv("SCHEDREF_PARALLEL")); err == nil && v > 0 {
		parallel = v
	}
	metrics.Register() // the framework counts plugin calls in these
	registry := frameworkplugins.NewInTreeRegistry()

	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<30)
	out := bufio.NewWriter(os.Stdout)
	enc := json.NewEncoder(out)

	// Cases run concurrently; answers are written in input order.
	order := make(chan chan answer, 4*parallel)
	slots := make(chan struct{}, parallel)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ch := range order {
			if err := enc.Encode(<-ch); err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
			if len(order) == 0 {
				out.Flush()
			}
		}
		out.Flush()
	}()
	for in.Scan() {
		line := in.Bytes()
		if len(strings.TrimSpace(string(line))) == 0 {
			continue
		}
		line = append([]byte(nil), line...)
		ch := make(chan answer, 1)
		order <- ch
		slots <- struct{}{}
		go func() {
			defer func() { <-slots }()
			ch <- run(line, registry)
		}()
	}
	close(order)
	<-done
	if err := in.Err(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
