{{- /*
The node agent on MPS-mode nodes (nodeConfig[].operatingmode: mps): the control daemon runs as the
agent's child, under nodeAgent.mps.root on the host (pipe/, log/, shm/), mounted at the same path in
the agent (it hands those host paths to kubelet for GPU containers), with <root>/shm also as the agent's
/dev/shm (the daemon, its servers and their clients share one /dev/shm).
*/ -}}

{{/* "true" when the agent gets the MPS mounts and flags: nodeAgent.mps.enabled, or a nodeConfig entry in mps mode */}}
{{- define "hami.mps.enabled" -}}
{{- $on := .Values.nodeAgent.mps.enabled -}}
{{- range .Values.nodeAgent.nodeConfig -}}
{{- if eq (toString (index . "operatingmode" | default "")) "mps" -}}{{- $on = true -}}{{- end -}}
{{- end -}}
{{- if $on -}}true{{- end -}}
{{- end -}}

{{/* the MPS root on the host, without a trailing slash */}}
{{- define "hami.mps.root" -}}{{ trimSuffix "/" (toString .Values.nodeAgent.mps.root) }}{{- end -}}

{{/* the agent container's securityContext: with MPS, SETUID and SETGID added to its capabilities (the
control daemon starts each MPS server as the user of its clients) */}}
{{- define "hami.nodeAgent.securityContext" -}}
{{- $context := deepCopy (.Values.nodeAgent.securityContext | default dict) -}}
{{- if include "hami.mps.enabled" . -}}
{{- $caps := deepCopy (get $context "capabilities" | default dict) -}}
{{- $add := concat (get $caps "add" | default list) (list "SETUID" "SETGID") | uniq -}}
{{- $_ := set $caps "add" $add -}}
{{- $_ := set $context "capabilities" $caps -}}
{{- end -}}
{{- with $context }}{{ toYaml . }}{{ end -}}
{{- end -}}
