{{/* Names, labels and selectors. Templates hold Kubernetes structure only: what a pod runs is computed by
`imagenet-train launch --deployment` from the ConfigMap in config.yaml. manifests/templates/ are the jinja2
twins (tools/render.py); tests/integration/test_chart.py proves both render the same objects. */}}

{{- define "imagenet-train.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 40 | trimSuffix "-" }}
{{- end }}

{{/* At most 50 characters, so suffixes (-shards, -fill, -0) and pod hostnames stay DNS labels. */}}
{{- define "imagenet-train.fullname" -}}
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

{{- define "imagenet-train.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "imagenet-train.selectorLabels" -}}
app.kubernetes.io/name: {{ include "imagenet-train.name" . | quote }}
app.kubernetes.io/instance: {{ .Release.Name | quote }}
{{- end }}

{{- define "imagenet-train.labels" -}}
helm.sh/chart: {{ include "imagenet-train.chart" . | quote }}
{{ include "imagenet-train.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service | quote }}
{{- end }}

{{- define "imagenet-train.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "imagenet-train.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "imagenet-train.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{- define "imagenet-train.queueLabel" -}}
{{- with .Values.launcher.runPolicy.kueueQueue }}
kueue.x-k8s.io/queue-name: {{ . | quote }}
{{- end }}
{{- end }}
