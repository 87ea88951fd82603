{{/*
Names, labels and the values several templates share.

Maps with defaults that are not empty (resources, the worker's nodeSelector)
are read with get: a user's null removes them from the values, and a
strict render (helm lint --strict) fails on a missing key.
*/}}

{{/* The chart's name, for app.kubernetes.io/name. */}}
{{- define "space.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The prefix of every resource name: RELEASE-CHART, or RELEASE when it
already contains the chart's name. 50 characters leave room for the
longest suffix ("-postgres") within a Service name's 63.
*/}}
{{- define "space.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* CHART-VERSION, for the helm.sh/chart label. */}}
{{- define "space.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The labels of every resource. */}}
{{- define "space.labels" -}}
helm.sh/chart: {{ include "space.chart" . }}
{{ include "space.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: space
{{- end }}

{{/* The labels that select the release's pods. */}}
{{- define "space.selectorLabels" -}}
app.kubernetes.io/name: {{ include "space.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
The labels of one component's resources; call with
(dict "ctx" $ "component" "server").
*/}}
{{- define "space.componentLabels" -}}
{{ include "space.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* The labels that select one component's pods; called like componentLabels. */}}
{{- define "space.componentSelectorLabels" -}}
{{ include "space.selectorLabels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* The control plane's ServiceAccount. */}}
{{- define "space.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "space.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The workers' ServiceAccount (workerDiscovery kubernetes). */}}
{{- define "space.workerServiceAccountName" -}}
{{- printf "%s-worker" (include "space.fullname" .) }}
{{- end }}

{{/*
Whether the workers publish Leases (workerDiscovery kubernetes): "true" or
"". Refuses it without rbac.create, which gives them the right to.
*/}}
{{- define "space.leaseDiscovery" -}}
{{- if eq .Values.workerDiscovery "kubernetes" }}
{{- if not .Values.rbac.create }}
{{- fail "workerDiscovery kubernetes needs rbac.create: the workers publish Leases and the control plane watches them (or set workerDiscovery: token)" }}
{{- end }}
{{- true }}
{{- end }}
{{- end }}

{{/* The image of every container. */}}
{{- define "space.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The Secret with the worker token and the secrets key. */}}
{{- define "space.clusterSecretName" -}}
{{- default (printf "%s-cluster" (include "space.fullname" .)) .Values.clusterSecret.existingSecret }}
{{- end }}

{{/* The Secret with the PostgreSQL URL. */}}
{{- define "space.postgresSecretName" -}}
{{- default (printf "%s-postgres" (include "space.fullname" .)) .Values.server.store.postgres.existingSecret }}
{{- end }}

{{/* The claim of the SQLite control plane's data dir. */}}
{{- define "space.sqliteClaimName" -}}
{{- default (printf "%s-server" (include "space.fullname" .)) .Values.server.store.sqlite.persistence.existingClaim }}
{{- end }}

{{/* The URL workers and proxies reach the control plane at: its Service. */}}
{{- define "space.serverURL" -}}
{{- printf "http://%s-server.%s.svc:%d" (include "space.fullname" .) .Release.Namespace (int .Values.server.port) }}
{{- end }}

{{/* The --data-plane-url of the control plane, or "" for itself. */}}
{{- define "space.dataPlaneURL" -}}
{{- if .Values.server.dataPlaneURL }}
{{- .Values.server.dataPlaneURL }}
{{- else if .Values.proxy.enabled }}
{{- printf "http://%s-proxy.%s.svc:%d" (include "space.fullname" .) .Release.Namespace (int .Values.proxy.port) }}
{{- end }}
{{- end }}

{{/*
Where the cluster Secret's files appear in a container, and where the
chunk store is mounted.
*/}}
{{- define "space.secretsDir" -}}/etc/space/secrets{{- end }}
{{- define "space.chunksDir" -}}/var/lib/space-chunks{{- end }}

{{/*
The --chunks of every replica and worker: the mounted directory, or with
chunkStore.type s3 the bucket's URL (credentials go in the environment,
space.chunksEnv).
*/}}
{{- define "space.chunksArg" -}}
{{- if eq .Values.chunkStore.type "s3" }}
{{- $s := .Values.chunkStore.s3 }}
{{- $q := list (printf "endpoint=%s" $s.endpoint) }}
{{- if not $s.tls }}{{- $q = append $q "tls=false" }}{{- end }}
{{- if $s.region }}{{- $q = append $q (printf "region=%s" (urlquery $s.region)) }}{{- end }}
{{- $prefix := trimAll "/" ($s.prefix | default "") }}
{{- printf "--chunks=s3://%s%s?%s" $s.bucket (ternary (printf "/%s" $prefix) "" (ne $prefix "")) (join "&" $q) }}
{{- else }}
{{- printf "--chunks=%s" (include "space.chunksDir" .) }}
{{- end }}
{{- end }}

{{/* The S3 chunk store's credentials, from chunkStore.s3.existingSecret, as env entries; "" for other stores. */}}
{{- define "space.chunksEnv" -}}
{{- if eq .Values.chunkStore.type "s3" }}
- name: SPACE_S3_ACCESS_KEY
  valueFrom:
    secretKeyRef:
      name: {{ .Values.chunkStore.s3.existingSecret }}
      key: access-key
- name: SPACE_S3_SECRET_KEY
  valueFrom:
    secretKeyRef:
      name: {{ .Values.chunkStore.s3.existingSecret }}
      key: secret-key
{{- end }}
{{- end }}

{{/* The volume of the cluster Secret with only the worker token, for workers and proxies. */}}
{{- define "space.workerTokenVolume" -}}
- name: worker-token
  secret:
    secretName: {{ include "space.clusterSecretName" . }}
    defaultMode: 0400
    items:
      - key: worker-token
        path: worker-token
{{- end }}

{{/*
The prometheus.io annotations of one component's pods, for a Prometheus
that discovers targets by them; "" when metrics or the annotations are off.
Call with (dict "ctx" $ "port" PORT).
*/}}
{{- define "space.scrapeAnnotations" -}}
{{- if and .ctx.Values.metrics.enabled .ctx.Values.metrics.scrapeAnnotations }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .port | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- end }}

{{/*
The job name of one component's metrics, and the value of the space/metrics
label of its metrics Service: space-server or space-worker. The alerting
rules (files/alerts.yaml) expect these jobs.
*/}}
{{- define "space.metricsJob" -}}
{{- printf "space-%s" . }}
{{- end }}
