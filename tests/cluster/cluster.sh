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
  DRAPartitionableDevices
  DRAPartitionableDevicesType
  DRAPrioritizedList
  DRAResourceClaimDeviceStatus
  DRAResourceClaimGranularStatusAuthorization
  DRAResourcePoolStatus
  DRASchedulerFilterTimeout
)
feature_gates() {
  local IFS=,
  echo "${DRA_FEATURE_GATES[*]/%/=true}"
}

# Controllers the tests rely on. node-lifecycle is deliberately absent: with no kubelets it
# would mark every Node NotReady and taint it after ~40 s. For the same reason
# kube-apiserver runs without the TaintNodesByCondition admission plugin, which taints every
# new Node not-ready until a kubelet reports in.
KCM_CONTROLLERS=(
  resourceclaim-controller device-taint-eviction-controller
  deployment-controller replicaset-controller statefulset-controller job-controller
  garbage-collector-controller namespace-controller
  persistentvolume-binder-controller
  serviceaccount-controller serviceaccount-token-controller
  root-ca-certificate-publisher-controller
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

certs() {
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
  local pki=$dir/pki
  # --allow-privileged as every real cluster (kubeadm, kind, the clouds) sets it: kubelet
  # DRA plugins such as the chart's node agent run privileged.
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
    --runtime-config resource.k8s.io/v1beta1=true,resource.k8s.io/v1beta2=true,resource.k8s.io/v1alpha3=true \
    --feature-gates "$(feature_gates)" \
    --endpoint-reconciler-type none \
    --disable-admission-plugins TaintNodesByCondition \
    --enable-priority-and-fairness=false \
    --profiling=false \
    --allow-privileged=true
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
    --kube-api-qps 200 --kube-api-burst 400
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
  # The same write budget as dra-scheduler's default, so comparisons are fair.
  qps: 100
  burst: 200
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

down() {
  local dir=$1
  [[ -d "$dir" ]] || return 0
  local f pid
  for f in "$dir"/pids/*; do
    [[ -f "$f" ]] || continue
    pid=$(cat "$f")
    # Each component runs in its own session: end the whole group.
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  done
  local i
  for ((i = 0; i < 40; i++)); do
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

case "${1:-}" in
  build) build ;;
  bindir) echo "$BIN" ;;
  up) up "$(resolve_dir "${2:-}")" ;;
  down) down "$(resolve_dir "${2:-}")" ;;
  env) env_cmd "$(resolve_dir "${2:-}")" ;;
  scheduler) scheduler "$(resolve_dir "${2:-}")" "${3:-}" ;;
  user) user "$(resolve_dir "${2:-}")" "${3:?user NAME}" ;;
  restart-apiserver) restart_apiserver "$(resolve_dir "${2:-}")" "${3:-0}" ;;
  *) echo "usage: $0 build|up|down|env|scheduler|bindir|user|restart-apiserver [DIR]" >&2; exit 2 ;;
esac
