{{/* Chart name, at most 63 characters. */}}
{{- define "oscarkv.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Object name: the release name, plus the chart name when the release name lacks it. */}}
{{- define "oscarkv.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "oscarkv.selectorLabels" -}}
app.kubernetes.io/name: {{ include "oscarkv.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: cache-daemon
{{- end -}}

{{- define "oscarkv.labels" -}}
{{ include "oscarkv.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* The address the daemon listens on: the node's IP via the downward API, or a literal. */}}
{{- define "oscarkv.listenHost" -}}
{{- if eq .Values.listenHost "hostIP" -}}$(HOST_IP){{- else -}}{{ .Values.listenHost }}{{- end -}}
{{- end -}}

{{/* "true" when the daemon listens on loopback only (no other host reaches it). */}}
{{- define "oscarkv.loopbackListen" -}}
{{- if has (toString .Values.listenHost) (list "127.0.0.1" "localhost" "::1") -}}true{{- end -}}
{{- end -}}

{{/* Refuses values that would expose every client's pages to the network unauthenticated. */}}
{{- define "oscarkv.checkSecurity" -}}
{{- if not (include "oscarkv.loopbackListen" .) -}}
{{- if and (not .Values.tls.enabled) (not .Values.allowPlaintext) -}}
{{- fail "tls.enabled is false: oscarkvd would serve plaintext gRPC on the node network, where anyone who reaches the port reads, changes and deletes every client's pages. Enable TLS (tls.enabled: true with a secret holding tls.crt, tls.key and ca.crt), listen on the node's loopback (listenHost: 127.0.0.1), or set allowPlaintext: true for a trusted network" -}}
{{- end -}}
{{- if and .Values.tls.enabled (not .Values.tls.clientCA) (not .Values.tls.allowUnauthenticatedClients) -}}
{{- fail "tls.clientCA is false: TLS without a client CA authenticates no client, so every client on the node network is the admin. Keep tls.clientCA: true (mTLS), listen on the node's loopback (listenHost: 127.0.0.1), or set tls.allowUnauthenticatedClients: true for a network of trusted clients" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The daemon configuration file (oscarkvd.yaml). */}}
{{- define "oscarkv.config" -}}
# oscarkvd configuration, rendered by the oscarkv Helm chart from .Values.config.
# listen and metrics_listen come from the DaemonSet's flags (the node's IP).
{{- $config := deepCopy .Values.config }}
{{- if and $config.ucx $config.ucx.enabled }}
{{- if .Values.ucxAllowUnverifiedRma }}
{{- $_ := set $config.ucx "allow_unverified_rma" true }}
{{- else if and (not .Values.tenantsEnabled) (eq (toString $config.ucx.net_devices) "") }}
{{- $_ := set $config.ucx "net_devices" "lo" }}
# ucx.net_devices: lo -- without tenants the whole-pool UCX data plane stays on this node's
# loopback (oscarkvd refuses it where another host could reach it: any peer that reaches it
# reads and writes the whole pool). tenantsEnabled gives each tenant a data plane of its own
# on the node IP; ucxAllowUnverifiedRma opens the pool's on a trusted network.
{{- end }}
{{- end }}
{{ toYaml $config }}
{{- if .Values.tls.enabled }}
tls:
  cert: /etc/oscarkv/tls/tls.crt
  key: /etc/oscarkv/tls/tls.key
{{- if .Values.tls.clientCA }}
  client_ca: /etc/oscarkv/tls/ca.crt
{{- else if .Values.tls.allowUnauthenticatedClients }}
  allow_unauthenticated_clients: true
{{- end }}
{{- end }}
{{- if .Values.tenantsEnabled }}
tenants:
{{ toYaml .Values.tenants | indent 2 }}
{{- end }}
{{- end -}}
