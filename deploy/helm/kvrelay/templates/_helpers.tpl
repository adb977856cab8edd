{{/* Names, labels and the few values several templates derive the same way. */}}

{{- define "kvrelay.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "kvrelay.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "kvrelay.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* An image: (list $ OVERRIDE), where OVERRIDE's empty repository or tag take the top-level ones. */}}
{{- define "kvrelay.image" -}}
{{- $root := index . 0 -}}
{{- $own := index . 1 | default dict -}}
{{- $repository := $own.repository | default $root.Values.image.repository -}}
{{- $tag := $own.tag | default $root.Values.image.tag | default $root.Chart.AppVersion -}}
{{- printf "%s:%s" $repository $tag -}}
{{- end -}}

{{/* The Secret holding KVRELAY_REDIS_URL and the Redis password. */}}
{{- define "kvrelay.redisSecret" -}}
{{- .Values.redis.auth.existingSecret | default (printf "%s-redis" (include "kvrelay.fullname" .)) -}}
{{- end -}}

{{- define "kvrelay.redisHost" -}}
{{- printf "%s-redis" (include "kvrelay.fullname" .) -}}
{{- end -}}

{{/* Redis as KEDA's operator reaches it, from its own namespace. */}}
{{- define "kvrelay.kedaRedisAddress" -}}
{{- if .Values.redis.internal.enabled -}}
{{- printf "%s.%s.svc:%v" (include "kvrelay.redisHost" .) .Release.Namespace .Values.redis.internal.port -}}
{{- else -}}
{{- required "redis.external.address is required when redis.internal.enabled is false" .Values.redis.external.address -}}
{{- end -}}
{{- end -}}

{{/*
Deep-merge the map (index . 1) into the map (index . 0), in place. Unlike mergeOverwrite,
an entry's false, 0 or "" wins over the default (minReplicas: 0, enabled: false).
*/}}
{{- define "kvrelay.mergeInto" -}}
{{- $dst := index . 0 -}}
{{- range $key, $value := index . 1 -}}
{{- if and (kindIs "map" $value) (kindIs "map" (index $dst $key)) -}}
{{- include "kvrelay.mergeInto" (list (index $dst $key) $value) -}}
{{- else -}}
{{- $_ := set $dst $key $value -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
A worker's settings: workerDefaults overridden by its entry. Called with
(dict "root" $ "name" KEY "spec" ENTRY); returns YAML (fromYaml it).
*/}}
{{- define "kvrelay.worker" -}}
{{- $w := deepCopy .root.Values.workerDefaults -}}
{{- include "kvrelay.mergeInto" (list $w (deepCopy (.spec | default dict))) -}}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$" .name) -}}
{{- fail (printf "workers.%s: the key names Kubernetes objects: lowercase letters, digits and '-'" .name) -}}
{{- end -}}
{{- $managed := list "KVRELAY_MODEL" "KVRELAY_MODEL_NAME" "KVRELAY_DEVICE" "KVRELAY_REDIS_URL" "KVRELAY_METRICS_PORT" "KVRELAY_METRICS_HOST" "KVRELAY_SHUTDOWN_GRACE" "KVRELAY_CACHE_DIR" -}}
{{- range $key, $_ := ($w.env | default dict) -}}
{{- if has $key $managed -}}
{{- fail (printf "workers.%s.env.%s: the chart sets this variable; use the worker's model, servedModelName, device, metricsPort, shutdownGrace or modelCache keys" $.name $key) -}}
{{- end -}}
{{- end -}}
{{- if not (has $w.device (list "cuda" "cpu")) -}}
{{- fail (printf "workers.%s.device must be cuda or cpu, got %v" .name $w.device) -}}
{{- end -}}
{{- $model := $w.model | default "" -}}
{{- $served := $w.servedModelName | default "" -}}
{{- if $w.huggingFace.repo -}}
{{- if not $w.huggingFace.persistentVolumeClaim -}}
{{- fail (printf "workers.%s.huggingFace.persistentVolumeClaim is required with huggingFace.repo" .name) -}}
{{- end -}}
{{- $model = printf "/var/cache/huggingface/models/%s" $w.huggingFace.repo -}}
{{- $served = $served | default $w.huggingFace.repo -}}
{{- end -}}
{{- if not $model -}}
{{- fail (printf "workers.%s.model is required" .name) -}}
{{- end -}}
{{- if and (hasPrefix "/" $model) (not $served) -}}
{{- fail (printf "workers.%s.servedModelName is required when model is a path" .name) -}}
{{- end -}}
{{- $_ := set $w "model" $model -}}
{{- $_ := set $w "servedModelName" ($served | default $model) -}}
{{- $_ := set $w "fullname" (printf "%s-worker-%s" (include "kvrelay.fullname" .root) .name) -}}
{{- $_ := set $w "key" .name -}}
{{- $w | toYaml -}}
{{- end -}}

{{/*
A model's Redis keys, as kvrelay.keys.Keyspace(KVRELAY_NAMESPACE) names them: "queue" (the
list of its queued jobs, Keyspace.queue) or "running" (the sorted set of its jobs being
run, Keyspace.running_jobs); "kvrelay:<kind>:<model>", or with a namespace
"kvrelay:ns:<namespace>:<kind>:<model>". Called with (dict "worker" W "kind" KIND).
*/}}
{{- define "kvrelay.modelKey" -}}
{{- $ns := dig "KVRELAY_NAMESPACE" "" (.worker.env | default dict) -}}
{{- if $ns -}}
{{- printf "kvrelay:ns:%s:%s:%s" $ns .kind .worker.servedModelName -}}
{{- else -}}
{{- printf "kvrelay:%s:%s" .kind .worker.servedModelName -}}
{{- end -}}
{{- end -}}

{{/* The KVRELAY_REDIS_URL entry of a container's env. */}}
{{- define "kvrelay.redisUrlEnv" -}}
- name: KVRELAY_REDIS_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "kvrelay.redisSecret" . }}
      key: {{ .Values.redis.auth.urlKey }}
{{- end -}}
