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

{{- define "imagenet-train.kueueLabels" -}}
{{- with .Values.launcher.runPolicy.kueueQueue }}
kueue.x-k8s.io/queue-name: {{ . | quote }}
{{- end }}
{{- with .Values.launcher.runPolicy.kueuePriorityClass }}
kueue.x-k8s.io/priority-class: {{ . | quote }}
{{- end }}
{{- end }}

{{/* Kueue's topology request for the training pods (launcher.placement), as pod-template annotations. */}}
{{- define "imagenet-train.topologyAnnotations" -}}
{{- with .Values.launcher.placement.requiredTopology }}
kueue.x-k8s.io/podset-required-topology: {{ . | quote }}
{{- end }}
{{- with .Values.launcher.placement.preferredTopology }}
kueue.x-k8s.io/podset-preferred-topology: {{ . | quote }}
{{- end }}
{{- end }}

{{/* Training processes per node: launcher.nprocPerNode, else one per GPU in resources.limits, else 1 (as
imagenet_train.deployment.nproc computes it for torchrun). */}}
{{- define "imagenet-train.nprocPerNode" -}}
{{- $gpus := index ((.Values.resources | default dict).limits | default dict) "nvidia.com/gpu" | default 0 | int }}
{{- .Values.launcher.nprocPerNode | default (max 1 $gpus) | int }}
{{- end }}
