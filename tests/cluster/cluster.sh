#!/usr/bin/env bash
# A real Kubernetes 1.37 control plane for tests: etcd, kube-apiserver and
# kube-controller-manager (and, on request, the reference kube-scheduler), built from Go
# modules and run on loopback only.
#
#   cluster.sh build              build whatever binary is missing (see BIN below)
#   cluster.sh up   [DIR]         build, then start a fresh cluster whose state lives in DIR
#   cluster.sh down [DIR]         stop it; no process and no DIR are left behind
#   cluster.sh env  [DIR]         print `export KUBECONFIG=...` and `export PATH=...`
#   cluster.sh scheduler [DIR] [NAME]  also start the reference kube-scheduler 1.37, serving
#                                 pods whose schedulerName is NAME (default-scheduler)
#   cluster.sh bindir             print the folder of the built binaries
#   cluster.sh user DIR NAME      write DIR/NAME.kubeconfig for a new user NAME (a client
#                                 certificate with CN=NAME and no group: it may do only
#                                 what RBAC grants NAME)
#   cluster.sh restart-apiserver DIR [SECONDS]  stop kube-apiserver, wait SECONDS (default
#                                 0), start it again with the same flags and state
#   cluster.sh build-node         build kubelet, containerd, its runc shim, ctr and the
#                                 sandbox program, whichever is missing (see NODE_BIN below)
#   cluster.sh node [DIR]         (after up) start a real node on this machine: containerd
#                                 and kubelet, registered as Node node-1; `down` stops it
#                                 and removes its containers, mounts, cgroups and sockets
#   cluster.sh ctr DIR ARGS...    run ctr against the node's containerd (namespace k8s.io),
#                                 e.g. `ctr DIR images import IMAGE.tar`
#
# `up` reads DRA_CLUSTER_KCM_QPS and DRA_CLUSTER_KCM_BURST: kube-controller-manager's client
# budget (default 200 and 400; benchmarks raise it so that making claims from templates is
# not the limit).
# `up` reads DRA_CLUSTER_RUNTIME_CONFIG: more --runtime-config entries for kube-apiserver,
# e.g. resource.k8s.io/v1/devicetaintrules=false to serve the APIs an older release serves,
# and DRA_CLUSTER_ADMISSION_PLUGINS: admission plugins to enable besides the default ones,
# e.g. OwnerReferencesPermissionEnforcement (both kept in DIR, so restart-apiserver keeps
# them).
#
# `up` with DRA_CLUSTER_NETNS=NAME puts the cluster in a network namespace of its own: the
# script makes NAME (loopback, and a veth pair holding the node's address
# $NETNS_NODE_ADDRESS), runs every later command on that DIR inside it (with nsenter, which
# keeps this machine's /sys and cgroups), and `down` deletes it. Nothing the cluster sends
# then leaves NAME: kube-apiserver reaches kubelet at the node's address there, and a pod
# network a test makes is there too.
#
# DIR defaults to tests/cluster/.run/default. Each DIR is an independent cluster on its own
# free ports, so several test binaries can each have one.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# Built binaries are kept per machine, outside any checkout, so a fresh clone (as CI makes)
# reuses them; the directory is named after the Kubernetes release they come from.
K8S_VERSION=v1.37.2
BIN=${DRA_CLUSTER_BIN:-${XDG_CACHE_HOME:-$HOME/.cache}/dra-scheduler/control-plane-$K8S_VERSION}
DEFAULT_DIR="$HERE/.run/default"
COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl)

# The real node (`cluster.sh node`): kubelet from the same k8s.io/kubernetes module, and
# containerd from its own module in node/, kept per machine like the control plane.
CONTAINERD_VERSION=v2.4.2
NODE_BIN=${DRA_NODE_BIN:-${XDG_CACHE_HOME:-$HOME/.cache}/dra-scheduler/node-$K8S_VERSION-containerd-$CONTAINERD_VERSION}
NODE_COMPONENTS=(kubelet containerd containerd-shim-runc-v2 ctr pause)
NODE_NAME=node-1
NETNS_NODE_ADDRESS=10.99.0.2
# Images made on this machine from local files (no registry is reachable): the sandbox,
# and busybox (Debian's busybox-static) for test pods.
PAUSE_IMAGE=localhost/dra-scheduler/pause:test
BUSYBOX_IMAGE=localhost/dra-scheduler/busybox:test

# Every DRA feature gate Kubernetes 1.37 knows, on (plus the gates two of them depend on).
# GA gates that are locked to true are listed too: setting them to their locked value is allowed.
DRA_FEATURE_GATES=(
  DRAAdminAccess
  DRAConsumableCapacity
  DRADerivedAttributes
  DRADeviceBindingConditions
  DRADeviceCompatibilityGroups
  DRADeviceTaintRules
  DRADeviceTaints
  DRAExtendedResource
  DRAFractionalCapacityRange
  DRAListTypeAttributes
  DRANodeAllocatableResources
  DRAOptionalNodeOperations
  DRAPartitionableDevices
  DRAPartitionableDevicesType
  DRAPrioritizedList
  DRAResourceClaimDeviceStatus
  DRAResourceClaimGranularStatusAuthorization
  DRAResourcePoolStatus
  DRASchedulerFilterTimeout
)
# Workload-aware scheduling (issue 16), all off by default in 1.37: GenericWorkload serves
# Workload and PodGroup (scheduling.k8s.io/v1beta1, see WORKLOAD_RUNTIME_CONFIG) and puts
# kube-scheduler's GangScheduling plugin in its default profile; TopologyAwareWorkloadScheduling
# adds TopologyPlacementGenerator and PodGroupPodsCount (schedulingConstraints.topology);
# DRAWorkloadResourceClaims lets a PodGroup's resourceClaims be reserved for the group.
# Left off: CompositePodGroup (would need scheduling.k8s.io/v1alpha3 served, and kube-scheduler
# watches it), PodGroupPreemptionPolicy and WorkloadWithJob (the job controller would make a
# Workload for every qualifying Job the tests create).
WORKLOAD_FEATURE_GATES=(
  GenericWorkload
  TopologyAwareWorkloadScheduling
  DRAWorkloadResourceClaims
)
# Beta API versions are off by default: Workload and PodGroup are served only with this.
WORKLOAD_RUNTIME_CONFIG=scheduling.k8s.io/v1beta1=true
ALL_FEATURE_GATES=("${DRA_FEATURE_GATES[@]}" "${WORKLOAD_FEATURE_GATES[@]}")
feature_gates() {
  local IFS=,
  echo "${ALL_FEATURE_GATES[*]/%/=true}"
}

# Controllers the tests rely on. node-lifecycle is deliberately absent: with no kubelets it
# would mark every Node NotReady and taint it after ~40 s. For the same reason
# kube-apiserver runs without the TaintNodesByCondition admission plugin, which taints every
# new Node not-ready until a kubelet reports in.
KCM_CONTROLLERS=(
  resourceclaim-controller device-taint-eviction-controller
  deployment-controller replicaset-controller statefulset-controller job-controller
  daemonset-controller
  garbage-collector-controller namespace-controller
  persistentvolume-binder-controller
  serviceaccount-controller serviceaccount-token-controller
  root-ca-certificate-publisher-controller
  podgroup-protection-controller
)

log() { echo "cluster.sh: $*" >&2; }
die() { log "error: $*"; exit 1; }

build() {
  local missing=()
  for c in "${COMPONENTS[@]}"; do [[ -x "$BIN/$c" ]] || missing+=("$c"); done
  [[ ${#missing[@]} -eq 0 ]] && return 0
  command -v go >/dev/null || die "go is not installed; it is needed to build ${missing[*]}"
  log "building ${missing[*]} from Go modules (first time: 10-25 minutes on 2 cores)"
  local pkgs=()
  for c in "${missing[@]}"; do
    case "$c" in
      etcd) pkgs+=(./cmd/etcd) ;;
      *) pkgs+=("k8s.io/kubernetes/cmd/$c") ;;
    esac
  done
  mkdir -p "$BIN"
  # Build into a temporary folder and move into place, so an interrupted build never
  # leaves a half-written binary that looks complete.
  local tmp
  tmp=$(mktemp -d "$BIN/.build.XXXXXX")
  # Stamp the release into the binaries, as Kubernetes' own build does, so `kubectl version`
  # and the components report v1.37.x instead of v0.0.0-master.
  local v=${K8S_VERSION#v} ldflags="" pkg
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=${v%%.*}"
    ldflags+=" -X $pkg.gitMinor=$(echo "$v" | cut -d. -f2) -X $pkg.gitTreeState=clean"
  done
  (cd "$HERE" && go build -trimpath -ldflags "$ldflags" -o "$tmp/" "${pkgs[@]}") \
    || { rm -rf "$tmp"; die "go build failed for ${missing[*]}"; }
  mv "$tmp"/* "$BIN/"
  rmdir "$tmp"
}

# The binaries of the real node. kubelet is stamped like the control plane; containerd
# without the btrfs, zfs and devmapper snapshotters (the node uses `native`), static as
# containerd's own release builds the shim.
build_node() {
  local missing=()
  for c in "${NODE_COMPONENTS[@]}"; do [[ -x "$NODE_BIN/$c" ]] || missing+=("$c"); done
  [[ ${#missing[@]} -eq 0 ]] && return 0
  command -v go >/dev/null || die "go is not installed; it is needed to build ${missing[*]}"
  log "building ${missing[*]} from Go modules (first time: about 4 minutes on 2 cores once the control plane is built)"
  mkdir -p "$NODE_BIN"
  local tmp pkgs=() c
  tmp=$(mktemp -d "$NODE_BIN/.build.XXXXXX")
  if [[ " ${missing[*]} " == *" kubelet "* ]]; then
    local v=${K8S_VERSION#v} ldflags="" pkg
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
      ldflags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=${v%%.*}"
      ldflags+=" -X $pkg.gitMinor=$(echo "$v" | cut -d. -f2) -X $pkg.gitTreeState=clean"
    done
    (cd "$HERE" && go build -trimpath -ldflags "$ldflags" -o "$tmp/" k8s.io/kubernetes/cmd/kubelet) \
      || { rm -rf "$tmp"; die "go build failed for kubelet"; }
  fi
  for c in "${missing[@]}"; do
    case "$c" in
      kubelet) ;;
      pause) pkgs+=(./pause) ;;
      *) pkgs+=("github.com/containerd/containerd/v2/cmd/$c") ;;
    esac
  done
  if [[ ${#pkgs[@]} -gt 0 ]]; then
    (cd "$HERE/node" && CGO_ENABLED=0 go build -trimpath \
      -tags "urfave_cli_no_docs no_btrfs no_zfs no_devmapper" \
      -ldflags "-X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION" \
      -o "$tmp/" "${pkgs[@]}") \
      || { rm -rf "$tmp"; die "go build failed for ${pkgs[*]}"; }
  fi
  mv "$tmp"/* "$NODE_BIN/"
  rmdir "$tmp"
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

# Start a process in its own session, record its pid, send its output to DIR/logs.
start() {
  local dir=$1 name=$2; shift 2
  setsid "$@" >"$dir/logs/$name.log" 2>&1 < /dev/null &
  echo $! >"$dir/pids/$name"
}

# wait_for NAME SECONDS DIR CHECK...: poll CHECK until it succeeds, NAME's process dies, or
# SECONDS pass; on failure show the end of NAME's log.
wait_for() {
  local what=$1 seconds=$2 dir=$3; shift 3
  local logfile=$dir/logs/$what.log pid i
  pid=$(cat "$dir/pids/$what")
  for ((i = 0; i < seconds * 4; i++)); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    if ! kill -0 "$pid" 2>/dev/null; then
      log "$what exited before it became ready; last lines of $logfile:"
      tail -n 30 "$logfile" >&2 || true
      return 1
    fi
    sleep 0.25
  done
  log "$what did not become ready in ${seconds}s; last lines of $logfile:"
  tail -n 30 "$logfile" >&2 || true
  return 1
}

# Every cluster's certificates are alike (loopback names, fixed subjects), so they are made
# once a day into PKI_CACHE and copied: seven RSA keys less for each cluster that starts
# (about 2 s of a 7 s start with two test binaries running). They are valid two days, so a
# copy taken late in the day still outlives any test.
PKI_CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/dra-scheduler/pki
certs() {
  local pki=$1 day fresh
  day=$PKI_CACHE/$(date -u +%Y-%m-%d)
  if [[ ! -f $day/done ]]; then
    mkdir -p "$PKI_CACHE"
    fresh=$(mktemp -d "$day.XXXXXX")
    make_certs "$fresh"
    touch "$fresh/done"
    # Another cluster may have made the day's set meanwhile: theirs stays.
    mv -T "$fresh" "$day" 2>/dev/null || rm -rf "$fresh"
    find "$PKI_CACHE" -mindepth 1 -maxdepth 1 ! -name "$(basename "$day")*" -mmin +1440 \
      -exec rm -rf {} + 2>/dev/null || true
  fi
  mkdir -p "$(dirname "$pki")"
  cp -r "$day" "$pki"
  rm -f "$pki/done"
}

make_certs() {
  local pki=$1
  mkdir -p "$pki"
  (
    cd "$pki"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 2 \
      -subj "/CN=dra-scheduler-test-ca" 2>/dev/null
    # kube-apiserver's serving certificate: loopback and the in-cluster service names.
    cat >apiserver.ext <<EOF
subjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local
extendedKeyUsage=serverAuth
EOF
    leaf apiserver "/CN=kube-apiserver" apiserver.ext
    printf 'extendedKeyUsage=clientAuth\n' >client.ext
    leaf admin "/O=system:masters/CN=kubernetes-admin" client.ext
    leaf controller-manager "/CN=system:kube-controller-manager" client.ext
    leaf scheduler "/CN=system:kube-scheduler" client.ext
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
  )
}

leaf() {
  local name=$1 subject=$2 ext=$3
  openssl req -newkey rsa:2048 -nodes -keyout "$name.key" -out "$name.csr" -subj "$subject" 2>/dev/null
  openssl x509 -req -in "$name.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 \
    -extfile "$ext" -out "$name.crt" 2>/dev/null
}

kubeconfig() {
  local dir=$1 user=$2 port=$3
  cat >"$dir/$user.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
    server: https://127.0.0.1:$port
    certificate-authority: $dir/pki/ca.crt
users:
- name: $user
  user:
    client-certificate: $dir/pki/$user.crt
    client-key: $dir/pki/$user.key
contexts:
- name: test
  context: {cluster: test, user: $user}
current-context: test
EOF
}

# kube-apiserver on the ports recorded in DIR (also used to restart it).
start_apiserver() {
  local dir=$1 etcd_client api_port
  etcd_client=$(cat "$dir/etcd.port")
  api_port=$(cat "$dir/apiserver.port")
  local pki=$dir/pki extra=()
  if [[ -s $dir/admission-plugins ]]; then
    extra+=(--enable-admission-plugins "$(cat "$dir/admission-plugins")")
  fi
  # --allow-privileged as every real cluster (kubeadm, kind, the clouds) sets it: kubelet
  # DRA plugins such as the chart's node agent run privileged. It reaches kubelets (logs,
  # exec, port-forward on a `cluster.sh node`) with the admin certificate, which kubelet's
  # webhook authorizer allows, at the node's InternalIP (its name resolves nowhere);
  # without a node it never uses either.
  start "$dir" kube-apiserver "$BIN/kube-apiserver" \
    --etcd-servers "http://127.0.0.1:$etcd_client" \
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$api_port" \
    --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
    --client-ca-file "$pki/ca.crt" \
    --service-account-key-file "$pki/sa.pub" \
    --service-account-signing-key-file "$pki/sa.key" \
    --service-account-issuer https://kubernetes.default.svc \
    --service-cluster-ip-range 10.0.0.0/24 \
    --authorization-mode Node,RBAC \
    --runtime-config "resource.k8s.io/v1beta1=true,resource.k8s.io/v1beta2=true,resource.k8s.io/v1alpha3=true,$WORKLOAD_RUNTIME_CONFIG$(runtime_config_extra "$dir")" \
    --feature-gates "$(feature_gates)" \
    --endpoint-reconciler-type none \
    --disable-admission-plugins TaintNodesByCondition \
    --enable-priority-and-fairness=false \
    --profiling=false \
    --allow-privileged=true \
    --kubelet-client-certificate "$pki/admin.crt" --kubelet-client-key "$pki/admin.key" \
    --kubelet-preferred-address-types InternalIP \
    ${extra[@]+"${extra[@]}"}
}

# The extra --runtime-config entries `up` was given, with a leading comma.
runtime_config_extra() {
  local file=$1/runtime-config
  [[ -s $file ]] && printf ',%s' "$(cat "$file")"
  return 0
}

restart_apiserver() {
  local dir=$1 pause=${2:-0} pid i
  [[ -f "$dir/pids/kube-apiserver" ]] || die "no cluster in $dir"
  pid=$(cat "$dir/pids/kube-apiserver")
  kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < 120; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.25
  done
  kill -KILL -- "-$pid" 2>/dev/null || true
  sleep "$pause"
  start_apiserver "$dir"
  wait_for kube-apiserver 180 "$dir" \
    "$BIN/kubectl" --kubeconfig "$dir/admin.kubeconfig" get --raw /readyz
  log "kube-apiserver restarted in $dir"
}

# A client certificate and kubeconfig for user NAME (no groups).
user() {
  local dir=$1 name=$2
  [[ -f "$dir/admin.kubeconfig" ]] || die "no cluster in $dir (cluster.sh up $dir first)"
  [[ $name =~ ^[a-z0-9][a-z0-9.-]*$ ]] || die "user name $name: lower-case letters, digits, '.' and '-' only"
  (cd "$dir/pki" && leaf "$name" "/CN=$name" client.ext)
  kubeconfig "$dir" "$name" "$(cat "$dir/apiserver.port")"
  echo "$dir/$name.kubeconfig"
}

up() {
  local dir=$1
  build
  if [[ -f "$dir/pids/kube-apiserver" ]] && kill -0 "$(cat "$dir/pids/kube-apiserver")" 2>/dev/null; then
    die "a cluster is already running in $dir (cluster.sh down $dir first)"
  fi
  rm -rf "$dir"
  mkdir -p "$dir/logs" "$dir/pids" "$dir/etcd"
  # Inside the namespace already (see the end of this script): `down` deletes it.
  [[ -n ${DRA_CLUSTER_NETNS:-} ]] && echo "$DRA_CLUSTER_NETNS" >"$dir/netns"
  certs "$dir/pki"

  local etcd_client etcd_peer api_port
  etcd_client=$(free_port)
  etcd_peer=$(free_port)
  api_port=$(free_port)
  echo "$api_port" >"$dir/apiserver.port"

  start "$dir" etcd "$BIN/etcd" --name test --data-dir "$dir/etcd" \
    --listen-client-urls "http://127.0.0.1:$etcd_client" \
    --advertise-client-urls "http://127.0.0.1:$etcd_client" \
    --listen-peer-urls "http://127.0.0.1:$etcd_peer" \
    --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" \
    --initial-cluster "test=http://127.0.0.1:$etcd_peer" \
    --quota-backend-bytes 4294967296 --unsafe-no-fsync --log-level warn
  wait_for etcd 60 "$dir" \
    curl -sf "http://127.0.0.1:$etcd_client/health" || { down "$dir"; exit 1; }

  echo "$etcd_client" >"$dir/etcd.port"
  printf '%s' "${DRA_CLUSTER_RUNTIME_CONFIG:-}" >"$dir/runtime-config"
  printf '%s' "${DRA_CLUSTER_ADMISSION_PLUGINS:-}" >"$dir/admission-plugins"
  start_apiserver "$dir"
  local pki=$dir/pki
  kubeconfig "$dir" admin "$api_port"
  kubeconfig "$dir" controller-manager "$api_port"
  kubeconfig "$dir" scheduler "$api_port"
  wait_for kube-apiserver 180 "$dir" \
    "$BIN/kubectl" --kubeconfig "$dir/admin.kubeconfig" get --raw /readyz || { down "$dir"; exit 1; }

  local controllers
  controllers=$(IFS=,; echo "${KCM_CONTROLLERS[*]}")
  start "$dir" kube-controller-manager "$BIN/kube-controller-manager" \
    --kubeconfig "$dir/controller-manager.kubeconfig" \
    --authentication-kubeconfig "$dir/controller-manager.kubeconfig" \
    --authorization-kubeconfig "$dir/controller-manager.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port 0 \
    --controllers "$controllers" \
    --service-account-private-key-file "$pki/sa.key" \
    --root-ca-file "$pki/ca.crt" \
    --use-service-account-credentials=true \
    --feature-gates "$(feature_gates)" \
    --leader-elect=false \
    --concurrent-deployment-syncs 10 --concurrent-replicaset-syncs 10 \
    --kube-api-qps "${DRA_CLUSTER_KCM_QPS:-200}" --kube-api-burst "${DRA_CLUSTER_KCM_BURST:-400}"
  # The controller manager is ready once it has created the default ServiceAccount
  # (pods are admitted only then).
  wait_for kube-controller-manager 120 "$dir" \
    "$BIN/kubectl" --kubeconfig "$dir/admin.kubeconfig" -n default get serviceaccount default \
    || { down "$dir"; exit 1; }
  log "cluster up in $dir (kube-apiserver https://127.0.0.1:$api_port)"
}

scheduler() {
  local dir=$1 name=${2:-default-scheduler}
  [[ -f "$dir/admin.kubeconfig" ]] || die "no cluster in $dir (cluster.sh up $dir first)"
  cat >"$dir/scheduler-config.yaml" <<EOF
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: $dir/scheduler.kubeconfig
  # The same write budget as dra-scheduler's default, so comparisons are fair
  # (DRA_SCHEDULER_QPS and DRA_SCHEDULER_BURST raise both for benchmarks).
  qps: ${DRA_SCHEDULER_QPS:-100}
  burst: ${DRA_SCHEDULER_BURST:-200}
leaderElection:
  leaderElect: false
profiles:
- schedulerName: $name
EOF
  start "$dir" kube-scheduler "$BIN/kube-scheduler" \
    --config "$dir/scheduler-config.yaml" \
    --authentication-kubeconfig "$dir/scheduler.kubeconfig" \
    --authorization-kubeconfig "$dir/scheduler.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port 0 \
    --feature-gates "$(feature_gates)"
  sleep 1
  kill -0 "$(cat "$dir/pids/kube-scheduler")" 2>/dev/null || {
    tail -n 20 "$dir/logs/kube-scheduler.log" >&2
    die "kube-scheduler exited"
  }
  log "kube-scheduler started (schedulerName $name)"
}

# Kernel settings kubelet changes at start (vm.overcommit_memory, kernel.panic, ...):
# saved before it starts, put back by `down`.
NODE_SYSCTLS=(vm/overcommit_memory vm/panic_on_oom kernel/panic kernel/panic_on_oops
  kernel/keys/root_maxkeys kernel/keys/root_maxbytes)

node_missing() {
  local missing=()
  [[ $(id -u) -eq 0 ]] || missing+=("root (kubelet and containerd run as root)")
  node_runc >/dev/null || missing+=("runc (apt-get install runc)")
  [[ -x /bin/busybox ]] || missing+=("/bin/busybox (apt-get install busybox-static)")
  [[ -d /sys/fs/cgroup/memory || -f /sys/fs/cgroup/cgroup.controllers ]] \
    || missing+=("cgroups (/sys/fs/cgroup has neither a memory controller nor cgroup v2)")
  command -v mount >/dev/null || missing+=("mount (apt-get install mount)")
  ! compgen -G '/etc/containerd/conf.d/*.toml' >/dev/null \
    || missing+=("no /etc/containerd/conf.d/*.toml (containerd 2.4 always reads them; they would change the node's containerd)")
  [[ -n $(node_address "$1") ]] || missing+=("a non-loopback IPv4 address (kubelet refuses 127.0.0.1 as its node IP)")
  [[ ${#missing[@]} -eq 0 ]] \
    || die "a node cannot run on this machine; missing: $(printf '%s; ' "${missing[@]}")"
}

# Debian's runc, found also when /usr/sbin is not on PATH.
node_runc() {
  local r
  r=$(command -v runc || true)
  [[ -n $r && -x $r ]] || r=/usr/sbin/runc
  [[ -x $r ]] && echo "$r"
}

# This machine's first global IPv4 address: the node's IP.
# The node's address: in a cluster's own network namespace, the one made there; else this
# machine's first non-loopback IPv4 address.
node_address() {
  if [[ -f $1/netns ]]; then echo "$NETNS_NODE_ADDRESS"; else node_ip; fi
}

node_ip() {
  python3 - <<'EOF'
import socket, fcntl, struct, os
for name in sorted(os.listdir("/sys/class/net")):
    if name == "lo":
        continue
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))
    except OSError:
        continue
    ip = socket.inet_ntoa(packed[20:24])
    if not ip.startswith(("127.", "169.254.")):
        print(ip)
        break
EOF
}

# The node's images, as OCI archives, imported into its containerd.
node_images() {
  local dir=$1 nd=$1/node root
  root=$nd/images
  mkdir -p "$root/pause" "$root/busybox/bin"
  cp "$NODE_BIN/pause" "$root/pause/pause"
  local arch
  arch=$(node_arch)
  OCI_ARCH=$arch "$HERE/node/oci-image.sh" "$root/pause.tar" "$PAUSE_IMAGE" "$root/pause" --entrypoint /pause
  cp /bin/busybox "$root/busybox/bin/busybox"
  local applet
  for applet in $(/bin/busybox --list); do
    [[ $applet == busybox ]] || ln -sf busybox "$root/busybox/bin/$applet"
  done
  OCI_ARCH=$arch "$HERE/node/oci-image.sh" "$root/busybox.tar" "$BUSYBOX_IMAGE" "$root/busybox" --cmd sh
  node_ctr "$dir" images import "$root/pause.tar" >/dev/null 2>&1 \
    || node_ctr "$dir" images import "$root/pause.tar" || die "ctr could not import $root/pause.tar"
  node_ctr "$dir" images import "$root/busybox.tar" >/dev/null 2>&1 \
    || node_ctr "$dir" images import "$root/busybox.tar" || die "ctr could not import $root/busybox.tar"
}

# The Go name of this machine's architecture, as images name their platform.
node_arch() {
  case "$(uname -m)" in
    x86_64) echo amd64 ;;
    aarch64) echo arm64 ;;
    *) uname -m ;;
  esac
}

node_ctr() {
  local dir=$1; shift
  "$NODE_BIN/ctr" --address "$dir/node/containerd/containerd.sock" --namespace k8s.io "$@"
}

start_node() {
  local dir=$1 nd=$1/node
  [[ -f "$dir/admin.kubeconfig" ]] || die "no cluster in $dir (cluster.sh up $dir first)"
  [[ ! -d "$nd" ]] || die "a node already runs in $dir"
  node_missing "$dir"
  build_node
  mkdir -p "$nd/containerd" "$nd/kubelet" "$nd/pod-logs" "$nd/volume-plugins" "$nd/cni/net.d"
  # What kubelet and containerd create outside DIR, for `down` to remove.
  local f
  for f in "${NODE_SYSCTLS[@]}"; do echo "$f $(cat "/proc/sys/$f")"; done >"$nd/sysctl.saved"
  for f in /var/log/containers /run/containerd/s /run/containerd \
    /var/lib/kubelet/device-plugins /var/lib/kubelet; do
    [[ -e $f ]] && echo "$f"
  done >"$nd/existed"

  local runc feature_map gate
  runc=$(node_runc)
  cat >"$nd/containerd.toml" <<EOF
version = 4
root = "$nd/containerd/root"
state = "$nd/containerd/state"
# (containerd also reads /etc/containerd/conf.d/*.toml, whatever this file says: start_node
# refuses to run while such files exist.)
# NRI's socket and /opt/containerd would live outside DIR; the node needs neither.
disabled_plugins = ["io.containerd.nri.v1.nri", "io.containerd.internal.v1.opt"]

[plugins.'io.containerd.server.v1.grpc']
  address = "$nd/containerd/containerd.sock"
[plugins.'io.containerd.server.v1.ttrpc']
  address = "$nd/containerd/containerd.sock.ttrpc"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "native"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "$PAUSE_IMAGE"

[plugins.'io.containerd.cri.v1.runtime']
  # This machine may not lower oom_score_adj: without this runc fails every sandbox with
  # "can't get final child's PID from pipe: EOF".
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  # CDI is always on in containerd 2; these are its default folders, where DRA drivers
  # write their specs.
  cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
    BinaryName = "$runc"
    Root = "$nd/containerd/runc"
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    conf_dir = "$nd/cni/net.d"
    bin_dirs = ["$nd/cni/bin"]

# ctr images import (through the transfer service) unpacks for the snapshotter CRI uses.
[[plugins.'io.containerd.transfer.v1.local'.unpack_config]]
  platform = "linux/$(node_arch)"
  snapshotter = "native"

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
EOF
  start "$dir" containerd env PATH="$NODE_BIN:$PATH" "$NODE_BIN/containerd" --config "$nd/containerd.toml"
  wait_for containerd 60 "$dir" node_ctr "$dir" version || die "containerd did not start"
  node_images "$dir"

  (cd "$dir/pki" && leaf kubelet "/O=system:nodes/CN=system:node:$NODE_NAME" client.ext)
  kubeconfig "$dir" kubelet "$(cat "$dir/apiserver.port")"
  # kubelet refuses a loopback node IP, and kube-apiserver reaches kubelet (logs, exec,
  # port-forward) at the IP the Node reports, which kubelet alone listens on: the address
  # made in the cluster's own network namespace, or else the machine's own address (that
  # traffic never leaves the machine either).
  local port healthz node_ip
  node_ip=$(node_address "$dir")
  port=$(free_port)
  healthz=$(free_port)
  echo "$port" >"$nd/kubelet.port"
  feature_map=""
  for gate in "${ALL_FEATURE_GATES[@]}"; do feature_map+="  $gate: true"$'\n'; done
  cat >"$nd/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $node_ip
port: $port
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $healthz
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $dir/pki/ca.crt}
authorization: {mode: Webhook}
containerRuntimeEndpoint: unix://$nd/containerd/containerd.sock
imageServiceEndpoint: unix://$nd/containerd/containerd.sock
podLogsDir: $nd/pod-logs
volumePluginDir: $nd/volume-plugins
# This machine: cgroup v1, swap allowed, no systemd; no QoS cgroups or allocatable
# enforcement (kubelet would need to own the cgroup tree).
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
localStorageCapacityIsolation: false
# The test machine's disk may be nearly full: never evict for it, never collect the
# images made for the tests.
evictionHard: {memory.available: "1Mi", nodefs.available: "1Mi", imagefs.available: "1Mi"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
featureGates:
$feature_map
EOF
  # PATH without /usr/sbin: kubelet finds no iptables, so it adds no rules to this
  # machine's firewall (it would otherwise add a KUBE-FIREWALL chain to INPUT and OUTPUT).
  start "$dir" kubelet env PATH=/usr/local/bin:/usr/bin:/bin "$NODE_BIN/kubelet" \
    --config "$nd/kubelet.yaml" \
    --kubeconfig "$dir/kubelet.kubeconfig" \
    --root-dir "$nd/kubelet" \
    --cert-dir "$nd/kubelet/pki" \
    --hostname-override "$NODE_NAME" \
    --node-ip "$node_ip"
  wait_for kubelet 120 "$dir" \
    "$BIN/kubectl" --kubeconfig "$dir/admin.kubeconfig" get node "$NODE_NAME" \
    || die "kubelet did not register Node $NODE_NAME"
  log "node $NODE_NAME up in $dir (kubelet $node_ip:$port, containerd $nd/containerd/containerd.sock)"
  echo "$NODE_NAME"
}

# Mount points under a folder, deepest first.
mounts_under() {
  awk -v d="$1/" 'index($5, d) == 1 { print $5 }' /proc/self/mountinfo | sort -r -u
}

# Stop the node of DIR and remove everything it made outside DIR; leaves no mount under
# DIR (so `rm -rf DIR` cannot reach into a mounted folder).
node_down() {
  local dir=$1 nd=$1/node pid i
  # kubelet first, or it would start again what is stopped below.
  if [[ -f "$dir/pids/kubelet" ]]; then
    pid=$(cat "$dir/pids/kubelet")
    kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
  fi
  # Container ids (pods' sandboxes and containers), from containerd's state on disk.
  local ids=() id
  for f in "$nd"/containerd/root/io.containerd.grpc.v1.cri/{containers,sandboxes}/* \
    "$nd"/containerd/state/io.containerd.runtime.v2.task/*/*; do
    [[ -d $f ]] && ids+=("$(basename "$f")")
  done
  # Every container and its shim, through containerd while it runs.
  if [[ -S "$nd/containerd/containerd.sock" ]] && node_ctr "$dir" version >/dev/null 2>&1; then
    for id in $(node_ctr "$dir" tasks ls -q 2>/dev/null); do
      timeout 20 "$NODE_BIN/ctr" --address "$nd/containerd/containerd.sock" --namespace k8s.io \
        tasks delete --force "$id" >/dev/null 2>&1 || true
    done
  fi
  if [[ -f "$dir/pids/containerd" ]]; then
    pid=$(cat "$dir/pids/containerd")
    kill -TERM -- "-$pid" 2>/dev/null || true
    for ((i = 0; i < 40; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    kill -KILL -- "-$pid" 2>/dev/null || true
  fi
  # Whatever is left: processes in the containers' cgroups, and shims (their command line
  # names this node's containerd socket).
  local cg p
  for id in "${ids[@]}"; do
    for cg in /sys/fs/cgroup/k8s.io/"$id" /sys/fs/cgroup/*/k8s.io/"$id"; do
      [[ -f $cg/cgroup.procs ]] || continue
      while read -r p; do kill -KILL "$p" 2>/dev/null || true; done <"$cg/cgroup.procs"
    done
  done
  for p in /proc/[0-9]*; do
    if tr '\0' ' ' 2>/dev/null <"$p/cmdline" | grep -qF "$nd/containerd/"; then
      kill -KILL "${p#/proc/}" 2>/dev/null || true
    fi
  done
  # Mounts: kubelet's root dir (a bind mount onto itself), volumes, containers' rootfs.
  local m
  for ((i = 0; i < 20; i++)); do
    for m in $(mounts_under "$dir"); do umount "$m" 2>/dev/null || true; done
    [[ -z $(mounts_under "$dir") ]] && break
    sleep 0.25
  done
  for m in $(mounts_under "$dir"); do umount -l "$m" 2>/dev/null || true; done
  # Cgroups containerd made, one per container, under k8s.io in each hierarchy; k8s.io
  # itself when no other node uses it.
  for id in "${ids[@]}"; do
    for cg in /sys/fs/cgroup/k8s.io/"$id" /sys/fs/cgroup/*/k8s.io/"$id"; do
      [[ -d $cg ]] || continue
      for ((i = 0; i < 20; i++)); do rmdir "$cg" 2>/dev/null && break; sleep 0.25; done
    done
  done
  for cg in /sys/fs/cgroup/k8s.io /sys/fs/cgroup/*/k8s.io; do
    [[ -d $cg ]] && rmdir "$cg" 2>/dev/null || true
  done
  # Log links kubelet made in /var/log/containers; the folders of shim sockets and of
  # kubelet's device plugin socket; kernel settings.
  if [[ -d /var/log/containers ]]; then
    find /var/log/containers -maxdepth 1 -type l -lname "$nd/*" -delete 2>/dev/null || true
  fi
  # kubelet's device plugin socket has a fixed path, whatever its root dir: removed
  # unless another kubelet runs. A killed kubelet its parent has not reaped yet (a zombie,
  # e.g. one a test restarted itself) runs no more.
  local other=0
  for p in /proc/[0-9]*; do
    [[ $(cat "$p/comm" 2>/dev/null) == kubelet ]] || continue
    [[ $(awk '{print $3}' "$p/stat" 2>/dev/null) == Z ]] && continue
    other=1
  done
  [[ $other -eq 1 ]] || rm -f /var/lib/kubelet/device-plugins/kubelet.sock
  for f in /var/log/containers /run/containerd/s /run/containerd \
    /var/lib/kubelet/device-plugins /var/lib/kubelet; do
    grep -qxF "$f" "$nd/existed" 2>/dev/null || rmdir "$f" 2>/dev/null || true
  done
  if [[ -f "$nd/sysctl.saved" ]]; then
    local key value
    while read -r key value; do
      [[ $(cat "/proc/sys/$key") == "$value" ]] || echo "$value" >"/proc/sys/$key" || true
    done <"$nd/sysctl.saved"
  fi
  [[ -z $(mounts_under "$dir") ]] || die "mounts left under $dir: $(mounts_under "$dir" | tr '\n' ' ')"
}

down() {
  local dir=$1 netns=""
  [[ -d "$dir" ]] || return 0
  [[ -f $dir/netns ]] && netns=$(cat "$dir/netns")
  [[ -d "$dir/node" ]] && node_down "$dir"
  local f pid
  for f in "$dir"/pids/*; do
    [[ -f "$f" ]] || continue
    pid=$(cat "$f")
    # Each component runs in its own session: end the whole group.
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  done
  # Two seconds to end on their own, then killed: the cluster is thrown away with its
  # directory, and kube-apiserver drains for longer than 10 s after SIGTERM (etcd waits for
  # its connections), which made each test's teardown wait 10 s.
  local i
  for ((i = 0; i < 8; i++)); do
    local alive=0
    for f in "$dir"/pids/*; do
      [[ -f "$f" ]] && kill -0 "$(cat "$f")" 2>/dev/null && alive=1
    done
    [[ $alive -eq 0 ]] && break
    sleep 0.25
  done
  for f in "$dir"/pids/*; do
    [[ -f "$f" ]] && { kill -KILL -- "-$(cat "$f")" 2>/dev/null || kill -KILL "$(cat "$f")" 2>/dev/null || true; }
  done
  rm -rf "$dir"
  rmdir "$HERE/.run" 2>/dev/null || true
  if [[ -n $netns ]]; then ip netns del "$netns" 2>/dev/null || true; fi
}

# A network namespace for a cluster: loopback up, and the node's address on a veth pair
# (no route to anywhere else).
netns_make() {
  local name=$1
  [[ -e /var/run/netns/$name ]] && die "network namespace $name exists already"
  ip netns add "$name"
  ip -n "$name" link set lo up
  ip -n "$name" link add node0 type veth peer name node0-peer
  ip -n "$name" addr add "$NETNS_NODE_ADDRESS/24" dev node0
  ip -n "$name" link set node0 up
  ip -n "$name" link set node0-peer up
}

# Runs this script again, with the same arguments, inside network namespace $1.
in_netns() {
  local name=$1
  shift
  exec nsenter --net="/var/run/netns/$name" env DRA_CLUSTER_IN_NETNS=1 bash "${BASH_SOURCE[0]}" "$@"
}

env_cmd() {
  local dir=$1
  [[ -f "$dir/admin.kubeconfig" ]] || die "no cluster in $dir (cluster.sh up $dir first)"
  echo "export KUBECONFIG=$dir/admin.kubeconfig"
  echo "export PATH=$BIN:\$PATH"
}

resolve_dir() {
  local d=${1:-$DEFAULT_DIR}
  case "$d" in
    /|"$HOME"|"$HERE"|.) die "refusing to use $d as a cluster directory" ;;
  esac
  mkdir -p "$(dirname "$d")"
  echo "$(cd "$(dirname "$d")" && pwd)/$(basename "$d")"
}

# Commands on a cluster that lives in a network namespace run inside it.
if [[ -z ${DRA_CLUSTER_IN_NETNS:-} && $# -ge 2 ]]; then
  case $1 in
    up)
      if [[ -n ${DRA_CLUSTER_NETNS:-} ]]; then
        netns_make "$DRA_CLUSTER_NETNS"
        rc=0
        nsenter --net="/var/run/netns/$DRA_CLUSTER_NETNS" env DRA_CLUSTER_IN_NETNS=1 \
          bash "${BASH_SOURCE[0]}" "$@" || rc=$?
        # Failed before the cluster recorded it: nothing else will delete it.
        [[ $rc -eq 0 || -f $(resolve_dir "$2")/netns ]] || ip netns del "$DRA_CLUSTER_NETNS"
        exit "$rc"
      fi
      ;;
    down | env | scheduler | user | restart-apiserver | node | ctr)
      netns_dir=$(resolve_dir "$2")
      if [[ -f $netns_dir/netns && -e /var/run/netns/$(cat "$netns_dir/netns") ]]; then
        in_netns "$(cat "$netns_dir/netns")" "$@"
      fi
      ;;
  esac
fi

case "${1:-}" in
  build) build ;;
  bindir) echo "$BIN" ;;
  up) up "$(resolve_dir "${2:-}")" ;;
  down) down "$(resolve_dir "${2:-}")" ;;
  env) env_cmd "$(resolve_dir "${2:-}")" ;;
  scheduler) scheduler "$(resolve_dir "${2:-}")" "${3:-}" ;;
  user) user "$(resolve_dir "${2:-}")" "${3:?user NAME}" ;;
  restart-apiserver) restart_apiserver "$(resolve_dir "${2:-}")" "${3:-0}" ;;
  build-node) build_node ;;
  node) start_node "$(resolve_dir "${2:-}")" ;;
  ctr) [[ $# -ge 2 ]] || die "usage: $0 ctr DIR ARGS..."; d=$(resolve_dir "$2"); shift 2; node_ctr "$d" "$@" ;;
  *) echo "usage: $0 build|up|down|env|scheduler|bindir|user|restart-apiserver|build-node|node|ctr [DIR]" >&2; exit 2 ;;
esac
