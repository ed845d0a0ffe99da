{{/*
The chart name, or nameOverride.
*/}}
{{- define "dra-scheduler.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The object-name prefix: fullnameOverride, else the release name, with the chart name
appended when the release name does not already contain it. Truncated to 63 characters
(DNS label), leaving room for the "-node-agent" suffix in names derived from it.
*/}}
{{- define "dra-scheduler.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
chart: name-version, as the helm.sh/chart label.
*/}}
{{- define "dra-scheduler.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels every object carries.
*/}}
{{- define "dra-scheduler.labels" -}}
helm.sh/chart: {{ include "dra-scheduler.chart" . }}
app.kubernetes.io/name: {{ include "dra-scheduler.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: dra-scheduler
{{- end }}

{{/*
Selector labels of the scheduler pods (and their Service, PDB, ServiceMonitor).
*/}}
{{- define "dra-scheduler.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dra-scheduler.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: scheduler
{{- end }}

{{/*
Selector labels of the node agent pods.
*/}}
{{- define "dra-scheduler.nodeAgent.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dra-scheduler.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: node-agent
{{- end }}

{{/*
The scheduler's ServiceAccount name.
*/}}
{{- define "dra-scheduler.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "dra-scheduler.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The node agent's name prefix and ServiceAccount name.
*/}}
{{- define "dra-scheduler.nodeAgent.fullname" -}}
{{- printf "%s-node-agent" (include "dra-scheduler.fullname" .) }}
{{- end }}

{{- define "dra-scheduler.nodeAgent.serviceAccountName" -}}
{{- if .Values.nodeAgent.serviceAccount.create }}
{{- default (include "dra-scheduler.nodeAgent.fullname" .) .Values.nodeAgent.serviceAccount.name }}
{{- else }}
{{- required "nodeAgent.serviceAccount.name is required when nodeAgent.serviceAccount.create is false" .Values.nodeAgent.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
Images: repository:tag, the tag defaulting to the chart's appVersion.
*/}}
{{- define "dra-scheduler.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "dra-scheduler.nodeAgent.image" -}}
{{- printf "%s:%s" .Values.nodeAgent.image.repository (default .Chart.AppVersion .Values.nodeAgent.image.tag) }}
{{- end }}

{{/*
The Lease's name and namespace.
*/}}
{{- define "dra-scheduler.leaseName" -}}
{{- default .Values.schedulerName .Values.leaderElection.leaseName }}
{{- end }}

{{- define "dra-scheduler.leaseNamespace" -}}
{{- default .Release.Namespace .Values.leaderElection.leaseNamespace }}
{{- end }}

{{/*
The scheduler's config file (config.yaml). Keys are exactly those `dra-scheduler run
--config` accepts; an unknown key would stop the scheduler at start.
*/}}
{{- define "dra-scheduler.config" -}}
{{- if not (has .Values.config.logFormat (list "text" "json")) }}
{{- fail (printf "config.logFormat must be text or json, not %q" .Values.config.logFormat) }}
{{- end }}
{{- if and .Values.config.scoring .Values.config.profile }}
{{- fail "config.scoring and config.profile: set the weights in one of them" }}
{{- end }}
{{- if not (has .Values.config.handoff.owners (list "same" "any")) }}
{{- fail (printf "config.handoff.owners must be same or any, not %q" .Values.config.handoff.owners) }}
{{- end }}
{{- if and (gt (int .Values.replicaCount) 1) (not .Values.leaderElection.enabled) }}
{{- fail "replicaCount > 1 needs leaderElection.enabled: replicas without a leader would schedule the same pods twice" }}
{{- end -}}
schedulerName: {{ .Values.schedulerName | quote }}
logFormat: {{ .Values.config.logFormat }}
v: {{ int .Values.config.v }}
metricsBindAddress: {{ printf "0.0.0.0:%d" (int .Values.metrics.port) | quote }}
percentageOfNodesToScore: {{ int .Values.config.percentageOfNodesToScore }}
maxConcurrentBinds: {{ int .Values.config.maxConcurrentBinds }}
clientQPS: {{ .Values.config.clientQPS }}
clientBurst: {{ int .Values.config.clientBurst }}
filterTimeoutSeconds: {{ .Values.config.filterTimeoutSeconds }}
preemption:
  enabled: {{ .Values.config.preemption.enabled }}
handoff:
  enabled: {{ .Values.config.handoff.enabled }}
  owners: {{ .Values.config.handoff.owners }}
  marginSeconds: {{ .Values.config.handoff.marginSeconds }}
  maxWaitSeconds: {{ .Values.config.handoff.maxWaitSeconds }}
degraded:
  intervalSeconds: {{ .Values.config.degraded.intervalSeconds }}
  upgrade:
    enabled: {{ .Values.config.degraded.upgrade.enabled }}
    afterSeconds: {{ .Values.config.degraded.upgrade.afterSeconds }}
{{- with .Values.config.featureGates }}
featureGates:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.config.scoring }}
scoring:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.config.profile }}
profile:
  {{- toYaml . | nindent 2 }}
{{- end }}
leaderElection:
  leaderElect: {{ .Values.leaderElection.enabled }}
  leaseName: {{ include "dra-scheduler.leaseName" . | quote }}
  leaseNamespace: {{ include "dra-scheduler.leaseNamespace" . | quote }}
  leaseDurationSeconds: {{ int .Values.leaderElection.leaseDurationSeconds }}
  renewDeadlineSeconds: {{ int .Values.leaderElection.renewDeadlineSeconds }}
  retryPeriodSeconds: {{ int .Values.leaderElection.retryPeriodSeconds }}
{{- end }}

{{/*
The node agent's log format, checked as the scheduler's is.
*/}}
{{- define "dra-scheduler.nodeAgent.logFormat" -}}
{{- if not (has .Values.nodeAgent.logFormat (list "text" "json")) }}
{{- fail (printf "nodeAgent.logFormat must be text or json, not %q" .Values.nodeAgent.logFormat) }}
{{- end -}}
{{ .Values.nodeAgent.logFormat }}
{{- end }}
