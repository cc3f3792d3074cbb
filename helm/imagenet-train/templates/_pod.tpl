{{/* The training pod shared by every launcher: Kubernetes structure only. */}}

{{- define "imagenet-train.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: [ALL]
{{- end }}

{{- define "imagenet-train.trainerSecurityContext" -}}
{{- include "imagenet-train.containerSecurityContext" . }}
{{- with .Values.addCapabilities }}
  add:
    {{- toYaml . | nindent 4 }}
{{- end }}
{{- end }}

{{- define "imagenet-train.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* The pod runs `launch`, which reads deployment.yaml; `train` reads train.yaml (the chart's `train:`). */}}
{{- define "imagenet-train.args" -}}
- launch
- --deployment
- /etc/imagenet-train/deployment.yaml
- --
- train
- --config
- /etc/imagenet-train/train.yaml
{{- end }}

{{- define "imagenet-train.volumeMounts" -}}
- name: config
  mountPath: /etc/imagenet-train
  readOnly: true
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
{{- with .Values.extraVolumeMounts }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "imagenet-train.volumes" -}}
- name: config
  configMap:
    name: {{ printf "%s-config" (include "imagenet-train.fullname" .) | quote }}
- name: dshm
  emptyDir:
    medium: Memory
    sizeLimit: {{ .Values.shmSize | quote }}
- name: tmp
  emptyDir: {}
- name: results
{{- if .Values.results.existingClaim }}
  persistentVolumeClaim:
    claimName: {{ .Values.results.existingClaim | quote }}
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
    secretName: {{ .Values.gcp.credentialsSecret | quote }}
{{- end }}
{{- with .Values.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Scheduling and identity fields of the training pod (every launcher but trainjob takes them whole). */}}
{{- define "imagenet-train.podScheduling" -}}
serviceAccountName: {{ include "imagenet-train.serviceAccountName" . | quote }}
terminationGracePeriodSeconds: {{ .Values.terminationGracePeriodSeconds | int }}
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
priorityClassName: {{ . | quote }}
{{- end }}
{{- with .Values.topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.schedulerName }}
schedulerName: {{ . | quote }}
{{- end }}
{{- if .Values.hostNetwork }}
hostNetwork: true
dnsPolicy: ClusterFirstWithHostNet
{{- end }}
{{- end }}

{{/* Labels and annotations of the training pods' metadata. */}}
{{- define "imagenet-train.trainPodMetadata" -}}
labels:
  {{- include "imagenet-train.selectorLabels" . | nindent 2 }}
  app.kubernetes.io/component: trainer
  {{- with .Values.podLabels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- with merge (include "imagenet-train.topologyAnnotations" . | fromYaml) (.Values.podAnnotations | default dict) }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* With metrics on, local rank i's metrics port, named metrics-i (the PodMonitor's endpoints). */}}
{{- define "imagenet-train.metricsPorts" -}}
{{- if .Values.metrics.enabled }}
{{- $first := .Values.metrics.port | int }}
{{- range $i := until (include "imagenet-train.nprocPerNode" . | int) }}
- name: {{ printf "metrics-%d" $i | quote }}
  containerPort: {{ add $first $i }}
  protocol: TCP
{{- end }}
{{- end }}
{{- end }}

{{/* The training pod spec; `portName` names the rendezvous port. */}}
{{- define "imagenet-train.trainPodSpec" -}}
{{- $root := .root }}
{{- with .restartPolicy }}
restartPolicy: {{ . | quote }}
{{- end }}
{{- include "imagenet-train.podScheduling" $root | nindent 0 }}
{{- with .subdomain }}
subdomain: {{ . | quote }}
{{- end }}
containers:
  - name: pytorch
    image: {{ include "imagenet-train.image" $root | quote }}
    imagePullPolicy: {{ $root.Values.image.pullPolicy | quote }}
    args:
      {{- include "imagenet-train.args" $root | nindent 6 }}
    {{- with $root.Values.env }}
    env:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    ports:
      - name: {{ .portName | quote }}
        containerPort: {{ $root.Values.launcher.port | int }}
        protocol: TCP
      {{- with include "imagenet-train.metricsPorts" $root | trim }}
      {{- . | nindent 6 }}
      {{- end }}
    resources:
      {{- toYaml $root.Values.resources | nindent 6 }}
    securityContext:
      {{- include "imagenet-train.trainerSecurityContext" $root | nindent 6 }}
    volumeMounts:
      {{- include "imagenet-train.volumeMounts" $root | nindent 6 }}
volumes:
  {{- include "imagenet-train.volumes" $root | nindent 2 }}
{{- end }}
