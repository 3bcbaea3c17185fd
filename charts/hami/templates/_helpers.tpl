{{/*
Shared names, labels and small computed values. Every component's objects are named
"<fullname>-<component>" and labelled app.kubernetes.io/component=<component>; the RBAC tests find a
component's ClusterRole by that label.
*/}}

{{- define "hami.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "hami.fullname" -}}
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

{{/* Object names, one per component (kept short enough for Service names, 63 chars). */}}
{{- define "hami.scheduler.name" -}}{{ include "hami.fullname" . | trunc 50 | trimSuffix "-" }}-scheduler{{- end -}}
{{- define "hami.webhook.name" -}}{{ include "hami.fullname" . | trunc 52 | trimSuffix "-" }}-webhook{{- end -}}
{{- define "hami.webhook.tlsSecret" -}}{{ include "hami.webhook.name" . }}-tls{{- end -}}
{{- define "hami.certgen.name" -}}{{ include "hami.fullname" . | trunc 52 | trimSuffix "-" }}-certgen{{- end -}}
{{- define "hami.nodeAgent.name" -}}{{ include "hami.fullname" . | trunc 49 | trimSuffix "-" }}-node-agent{{- end -}}
{{- define "hami.deviceConfig.name" -}}{{ include "hami.fullname" . | trunc 46 | trimSuffix "-" }}-device-config{{- end -}}
{{- define "hami.nodeConfig.name" -}}
{{- if .Values.nodeAgent.externalConfigName -}}
{{- .Values.nodeAgent.externalConfigName -}}
{{- else -}}
{{- include "hami.fullname" . | trunc 48 | trimSuffix "-" }}-node-config
{{- end -}}
{{- end -}}

{{/* Labels on every object. */}}
{{- define "hami.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "hami.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: hami
{{- end -}}

{{/* Selector labels of one component: call with (dict "root" $ "component" "scheduler"). */}}
{{- define "hami.selectorLabels" -}}
app.kubernetes.io/name: {{ include "hami.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* All labels of one component's objects. */}}
{{- define "hami.componentLabels" -}}
{{ include "hami.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* ServiceAccount names (the same whether or not the chart creates them). */}}
{{- define "hami.scheduler.serviceAccount" -}}{{ include "hami.scheduler.name" . }}{{- end -}}
{{- define "hami.webhook.serviceAccount" -}}{{ include "hami.webhook.name" . }}{{- end -}}
{{- define "hami.nodeAgent.serviceAccount" -}}{{ include "hami.nodeAgent.name" . }}{{- end -}}

{{/*
Our image: registry/repository:tag, tag defaulting to the chart's appVersion. No image is published:
the registry is where the user pushed the one they built, and without it nothing could be pulled, so
rendering (helm install, upgrade, template) stops saying what to do (README.md, "Install on a cluster").
*/}}
{{- define "hami.image" -}}
{{- $repo := .Values.image.repository -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag | toString -}}
{{- $ref := printf "REGISTRY/%s:%s" $repo $tag -}}
{{- $registry := required (printf "image.registry is not set, and no %s image is published: build it and push it to a registry your nodes can pull from (docker build -t %s . && docker push %s), then set it: helm install ... --set image.registry=REGISTRY (docs/install.md)" $repo $ref $ref) .Values.image.registry -}}
{{- printf "%s/%s:%s" $registry $repo $tag -}}
{{- end -}}

{{/*
The kube-scheduler tag: the explicit one, else the cluster's version without the distribution suffix
(v1.31.1+k3s1 -> v1.31.1, v1.30.8-eks-2d98532 -> v1.30.8), so the stock scheduler matches the API server.
*/}}
{{- define "hami.kubeScheduler.tag" -}}
{{- $tag := .Values.scheduler.kubeScheduler.image.tag | toString -}}
{{- if $tag -}}
{{- $tag -}}
{{- else -}}
{{- regexFind "^v[0-9]+\\.[0-9]+\\.[0-9]+" .Capabilities.KubeVersion.Version -}}
{{- end -}}
{{- end -}}

{{- define "hami.kubeScheduler.image" -}}
{{- $img := .Values.scheduler.kubeScheduler.image -}}
{{- $repo := $img.repository -}}
{{- if $img.registry -}}{{- $repo = printf "%s/%s" $img.registry $repo -}}{{- end -}}
{{- printf "%s:%s" $repo (include "hami.kubeScheduler.tag" .) -}}
{{- end -}}

{{/* The resource names the scheduler manages (kube-scheduler ignores them, the webhook filters on them). */}}
{{- define "hami.managedResources" -}}
{{- $r := .Values.resourceNames -}}
{{- list $r.count $r.memory $r.memoryPercentage $r.cores | toJson -}}
{{- end -}}

{{/* Where the device config is mounted in every container. */}}
{{- define "hami.deviceConfig.dir" -}}/etc/hami/device-config{{- end -}}
{{- define "hami.deviceConfig.path" -}}{{ include "hami.deviceConfig.dir" . }}/device-config.yaml{{- end -}}

{{/* The device-config ConfigMap's content hash, put on pods so they roll when it changes. */}}
{{- define "hami.deviceConfig.checksum" -}}
{{- include (print .Template.BasePath "/device-configmap.yaml") . | sha256sum -}}
{{- end -}}

{{/* The webhook's DNS names; its serving certificate covers them, "localhost" and 127.0.0.1 (the same
list as webhook.config.service_hostnames, which the webhook checks its certificate against). */}}
{{- define "hami.webhook.dnsNames" -}}
{{- $svc := include "hami.webhook.name" . -}}
{{- list $svc (printf "%s.%s" $svc .Release.Namespace) (printf "%s.%s.svc" $svc .Release.Namespace) (printf "%s.%s.svc.cluster.local" $svc .Release.Namespace) "localhost" | toJson -}}
{{- end -}}
