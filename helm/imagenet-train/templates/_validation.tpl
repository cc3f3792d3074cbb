{{/* Cross-field rules JSON Schema cannot state, each with the line imagenet_train.deployment gives render.py and
the pods' launch: every message is collected, then the chart fails once (validation.yaml includes this). */}}

{{- define "imagenet-train.validate" -}}
{{- $errors := list }}
{{- $train := .Values.train | default dict }}
{{- $total := int (default 0 $train.global_batch_size) }}
{{- if $total }}
{{- $limits := (.Values.resources | default dict).limits | default dict }}
{{- $gpus := int (default 0 (index $limits "nvidia.com/gpu")) }}
{{- $ranks := mul (int .Values.launcher.nodes) (default (max 1 $gpus) (int .Values.launcher.nprocPerNode)) }}
{{- $accumulate := int (default 1 $train.grad_accum_steps) }}
{{- if mod $total (mul $ranks $accumulate) }}
{{- $over := ternary (printf " x %d train.grad_accum_steps" $accumulate) "" (gt $accumulate 1) }}
{{- $errors = append $errors (printf "train.global_batch_size: %d does not divide over %d ranks%s; expected a multiple of %d" $total $ranks $over (mul $ranks $accumulate)) }}
{{- end }}
{{- end }}
{{- if $errors }}
{{- fail (join "; " $errors) }}
{{- end }}
{{- end }}
