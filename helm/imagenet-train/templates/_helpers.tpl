{{/* Names, labels and the training pod shared by every launcher. tools/render.py mirrors this file in
manifests/templates/_helpers.j2; tests/test_chart.py proves both render the same objects. */}}

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
app.kubernetes.io/name: {{ include "imagenet-train.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "imagenet-train.labels" -}}
helm.sh/chart: {{ include "imagenet-train.chart" . }}
{{ include "imagenet-train.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "imagenet-train.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "imagenet-train.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "imagenet-train.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "imagenet-train.nproc" -}}
{{- if .Values.launcher.nprocPerNode }}{{ .Values.launcher.nprocPerNode }}{{ else }}{{ max 1 .Values.launcher.gpusPerNode }}{{ end }}
{{- end }}

{{- define "imagenet-train.runName" -}}
{{- default .Release.Name .Values.train.runName }}
{{- end }}

{{/* Where the loaders find the shard index. */}}
{{- define "imagenet-train.shardsURL" -}}
{{- $s := .Values.shards }}
{{- if eq $s.server "nginx" }}
{{- printf "http://%s-shards/%s" (include "imagenet-train.fullname" .) $s.index }}
{{- else if eq $s.server "aistore" }}
{{- printf "ais://%s/%s" $s.aistore.bucket $s.index }}
{{- else }}
{{- printf "%s/%s" (trimSuffix "/" $s.bucket.url) $s.index }}
{{- end }}
{{- end }}

{{- define "imagenet-train.aisEndpoint" -}}
{{- if .Values.shards.aistore.deploy }}
{{- printf "http://%s-ais-proxy:51080" (include "imagenet-train.fullname" .) }}
{{- else }}
{{- trimSuffix "/" .Values.shards.aistore.endpoint }}
{{- end }}
{{- end }}

{{/* Checks JSON Schema cannot express; tools/chart_values.py raises the same messages. */}}
{{- define "imagenet-train.validate" -}}
{{- $l := .Values.launcher }}
{{- $nproc := int (include "imagenet-train.nproc" .) }}
{{- if and $l.gpusPerNode $l.nprocPerNode (ne (int $l.nprocPerNode) (int $l.gpusPerNode)) }}
{{- fail (printf "launcher.nprocPerNode: %d processes cannot each own one of launcher.gpusPerNode=%d GPUs (set 0 for one per GPU)" (int $l.nprocPerNode) (int $l.gpusPerNode)) }}
{{- end }}
{{- $world := mul $l.nodes $nproc }}
{{- if and .Values.train.globalBatchSize (mod (int .Values.train.globalBatchSize) $world) }}
{{- fail (printf "train.globalBatchSize: %d does not divide over %d nodes x %d processes = %d GPUs" (int .Values.train.globalBatchSize) (int $l.nodes) $nproc $world) }}
{{- end }}
{{- if $l.elastic.enabled }}
{{- if eq $l.kind "trainjob" }}
{{- fail "launcher.elastic.enabled: trainjob has no elastic policy; use pytorchjob, indexedjob or jobset" }}
{{- end }}
{{- if or (gt (int $l.elastic.minNodes) (int $l.nodes)) (lt (int $l.elastic.maxNodes) (int $l.nodes)) }}
{{- fail (printf "launcher.elastic: nodes=%d must lie between minNodes=%d and maxNodes=%d" (int $l.nodes) (int $l.elastic.minNodes) (int $l.elastic.maxNodes)) }}
{{- end }}
{{- end }}
{{- if and (eq $l.restartPolicy "ExitCode") (ne $l.kind "pytorchjob") }}
{{- fail (printf "launcher.restartPolicy: ExitCode is a PyTorchJob policy; %s takes OnFailure or Never" $l.kind) }}
{{- end }}
{{- if and (eq $l.kind "trainjob") .Values.priorityClassName }}
{{- fail "priorityClassName: trainjob cannot set it per job; set it in the training runtime" }}
{{- end }}
{{- if and (gt (int .Values.shards.nginx.replicas) 1) (eq .Values.shards.server "nginx") (not .Values.shards.nginx.volume.existingClaim) (has "ReadWriteOnce" .Values.shards.nginx.volume.accessModes) }}
{{- fail (printf "shards.nginx.replicas: %d servers cannot share a ReadWriteOnce volume; use ReadOnlyMany/ReadWriteMany accessModes" (int .Values.shards.nginx.replicas)) }}
{{- end }}
{{- end }}

{{/* `imagenet-train launch ... -- train ...`: the same command line on every launcher. */}}
{{- define "imagenet-train.args" -}}
{{- $t := .Values.train }}
{{- $nproc := int (include "imagenet-train.nproc" .) }}
- launch
- --nproc-per-node
- {{ $nproc | quote }}
{{- if ne .Values.shards.server "bucket" }}
- --wait-for
- {{ include "imagenet-train.shardsURL" . | quote }}
- --wait-timeout
- {{ .Values.launcher.waitForShardsSeconds | quote }}
{{- end }}
- --
- train
- --shards
- {{ include "imagenet-train.shardsURL" . | quote }}
- --arch
- {{ $t.arch | quote }}
- --epochs
- {{ $t.epochs | quote }}
- --batch-size
{{- if $t.globalBatchSize }}
- {{ div (int $t.globalBatchSize) (mul .Values.launcher.nodes $nproc) | quote }}
{{- else }}
- {{ $t.batchSize | quote }}
{{- end }}
- --workers
- {{ $t.workers | quote }}
- --mode
- {{ $t.mode | quote }}
- --amp
- {{ $t.amp | quote }}
- --run-dir
- {{ printf "/results/%s" (include "imagenet-train.runName" .) | quote }}
{{- if .Values.results.bucket }}
- --results
- {{ printf "%s/%s" (trimSuffix "/" .Values.results.bucket) (include "imagenet-train.runName" .) | quote }}
{{- end }}
{{- if $t.resume }}
- --resume
- {{ $t.resume | quote }}
{{- end }}
{{- if $t.checkpointEvery }}
- --checkpoint-every
- {{ $t.checkpointEvery | quote }}
{{- end }}
{{- if .Values.cache.enabled }}
- --cache-dir
- /cache
{{- end }}
{{- range $t.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end }}

{{/* Environment for the app image: storage endpoints and credentials (never a key in values). */}}
{{- define "imagenet-train.storageEnv" -}}
{{- if eq .Values.shards.server "aistore" }}
- name: AIS_ENDPOINT
  value: {{ include "imagenet-train.aisEndpoint" . | quote }}
{{- end }}
{{- if .Values.gcp.credentialsSecret }}
- name: GOOGLE_APPLICATION_CREDENTIALS
  value: {{ printf "/var/run/secrets/gcp/%s" .Values.gcp.credentialsKey | quote }}
{{- end }}
{{- end }}

{{- define "imagenet-train.env" -}}
{{- include "imagenet-train.storageEnv" . }}
{{- $kind := .Values.launcher.kind }}
{{- if or (eq $kind "indexedjob") (eq $kind "jobset") }}
- name: NNODES
  value: {{ .Values.launcher.nodes | quote }}
- name: MASTER_ADDR
  value: {{ include "imagenet-train.masterAddr" . | quote }}
- name: MASTER_PORT
  value: {{ .Values.launcher.port | quote }}
{{- if .Values.launcher.elastic.enabled }}
- name: PET_NNODES
  value: {{ printf "%d:%d" (int .Values.launcher.elastic.minNodes) (int .Values.launcher.elastic.maxNodes) | quote }}
- name: PET_RDZV_BACKEND
  value: c10d
- name: PET_RDZV_ENDPOINT
  value: {{ printf "%s:%d" (include "imagenet-train.masterAddr" .) (int .Values.launcher.port) | quote }}
- name: PET_RDZV_ID
  value: {{ include "imagenet-train.fullname" . | quote }}
- name: PET_MAX_RESTARTS
  value: {{ .Values.launcher.elastic.maxRestarts | quote }}
{{- end }}
{{- end }}
{{- with .Values.train.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Pod 0's stable hostname: the headless Service's subdomain (indexedjob) or JobSet's own. */}}
{{- define "imagenet-train.masterAddr" -}}
{{- $name := include "imagenet-train.fullname" . }}
{{- if eq .Values.launcher.kind "jobset" }}
{{- printf "%s-node-0-0.%s" $name $name }}
{{- else }}
{{- printf "%s-0.%s" $name $name }}
{{- end }}
{{- end }}

{{- define "imagenet-train.resources" -}}
{{- $res := deepCopy .Values.resources }}
{{- if .Values.launcher.gpusPerNode }}
{{- $_ := set $res "limits" (merge (dict "nvidia.com/gpu" (int .Values.launcher.gpusPerNode)) (default (dict) $res.limits)) }}
{{- $_ := set $res "requests" (merge (dict "nvidia.com/gpu" (int .Values.launcher.gpusPerNode)) (default (dict) $res.requests)) }}
{{- end }}
{{- toYaml $res }}
{{- end }}

{{- define "imagenet-train.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: [ALL]
{{- end }}

{{- define "imagenet-train.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{- define "imagenet-train.volumeMounts" -}}
- name: dshm
  mountPath: /dev/shm
- name: tmp
  mountPath: /tmp
- name: results
  mountPath: /results
{{- if .Values.cache.enabled }}
- name: cache
  mountPath: /cache
{{- end }}
{{- if .Values.gcp.credentialsSecret }}
- name: gcp-credentials
  mountPath: /var/run/secrets/gcp
  readOnly: true
{{- end }}
{{- end }}

{{- define "imagenet-train.volumes" -}}
- name: dshm
  emptyDir:
    medium: Memory
    sizeLimit: {{ .Values.shmSize | quote }}
- name: tmp
  emptyDir: {}
- name: results
{{- if .Values.results.existingClaim }}
  persistentVolumeClaim:
    claimName: {{ .Values.results.existingClaim }}
{{- else }}
  emptyDir: {}
{{- end }}
{{- if .Values.cache.enabled }}
- name: cache
  emptyDir:
    sizeLimit: {{ .Values.cache.sizeLimit | quote }}
{{- end }}
{{- if .Values.gcp.credentialsSecret }}
- name: gcp-credentials
  secret:
    secretName: {{ .Values.gcp.credentialsSecret }}
{{- end }}
{{- end }}

{{/* Scheduling and identity fields of the training pod (every launcher but trainjob takes them whole). */}}
{{- define "imagenet-train.podScheduling" -}}
serviceAccountName: {{ include "imagenet-train.serviceAccountName" . }}
terminationGracePeriodSeconds: {{ .Values.terminationGracePeriodSeconds }}
securityContext:
  {{- include "imagenet-train.podSecurityContext" . | nindent 2 }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- end }}

{{/* The training pod spec; `containerPort` names the rendezvous port. */}}
{{- define "imagenet-train.trainPodSpec" -}}
{{- $root := .root }}
{{- with .restartPolicy }}
restartPolicy: {{ . }}
{{- end }}
{{- include "imagenet-train.podScheduling" $root | nindent 0 }}
{{- with .subdomain }}
subdomain: {{ . }}
{{- end }}
containers:
  - name: pytorch
    image: {{ include "imagenet-train.image" $root }}
    imagePullPolicy: {{ $root.Values.image.pullPolicy }}
    args:
      {{- include "imagenet-train.args" $root | nindent 6 }}
    {{- $env := include "imagenet-train.env" $root }}
    {{- if $env }}
    env:
      {{- $env | nindent 6 }}
    {{- end }}
    ports:
      - name: {{ .portName }}
        containerPort: {{ $root.Values.launcher.port }}
        protocol: TCP
    resources:
      {{- include "imagenet-train.resources" $root | nindent 6 }}
    securityContext:
      {{- include "imagenet-train.containerSecurityContext" $root | nindent 6 }}
    volumeMounts:
      {{- include "imagenet-train.volumeMounts" $root | nindent 6 }}
volumes:
  {{- include "imagenet-train.volumes" $root | nindent 2 }}
{{- end }}

{{- define "imagenet-train.queueLabel" -}}
{{- with .Values.launcher.runPolicy.queue }}
kueue.x-k8s.io/queue-name: {{ . }}
{{- end }}
{{- end }}
