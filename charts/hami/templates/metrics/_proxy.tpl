{{/*
Protection of the three /metrics endpoints (scheduler extender, webhook, node agent exporter), chosen by
metrics.protection:
- none: each component serves /metrics over plain HTTP on its metrics port (who can reach it is up to
  networkPolicy.metricsFrom);
- kube-rbac-proxy: the component serves /metrics on 127.0.0.1:metrics.kubeRbacProxy.upstreamPort only,
  and a kube-rbac-proxy sidecar serves HTTPS on the component's metrics port (same number and port name,
  so Services, ServiceMonitors and NetworkPolicies stay as they are). Each request must carry a bearer
  token (checked with a TokenReview) or a client certificate signed by the configured CA, and the
  identity must be allowed `get` on the non-resource URL /metrics (a SubjectAccessReview), e.g. through
  the <fullname>-metrics-reader ClusterRole bound to metrics.kubeRbacProxy.readers. Health paths on the
  same listener (/healthz, /readyz) pass without a token, so the kubelet's probes keep working.
*/}}

{{- define "hami.metrics.protected" -}}
{{- if eq .Values.metrics.protection "kube-rbac-proxy" -}}true{{- end -}}
{{- end -}}

{{/* The address a component's metrics listener binds: call with (dict "root" $ "port" N). */}}
{{- define "hami.metrics.listen" -}}
{{- if include "hami.metrics.protected" .root -}}
127.0.0.1:{{ .root.Values.metrics.kubeRbacProxy.upstreamPort }}
{{- else -}}
0.0.0.0:{{ .port }}
{{- end -}}
{{- end -}}

{{/* The scheme line of an httpGet probe on the metrics port: HTTPS through the proxy, else none. */}}
{{- define "hami.metrics.probeScheme" -}}
{{- if include "hami.metrics.protected" . }}scheme: HTTPS{{ end -}}
{{- end -}}

{{/*
The sidecar, as one item of a containers list: call with (dict "root" $ "port" N "health" (list paths))
where port is the component's metrics port (served here) and health the unauthenticated paths.
*/}}
{{- define "hami.metrics.proxyContainer" -}}
{{- $p := .root.Values.metrics.kubeRbacProxy -}}
{{- $img := $p.image -}}
- name: metrics-proxy
  image: {{ if $img.registry }}{{ $img.registry }}/{{ end }}{{ $img.repository }}:{{ $img.tag }}
  imagePullPolicy: {{ $img.pullPolicy }}
  args:
    - --secure-listen-address=0.0.0.0:{{ .port }}
    - --upstream=http://127.0.0.1:{{ $p.upstreamPort }}/
    {{- with .health }}
    - --ignore-paths={{ join "," . }}
    {{- end }}
    - --http2-disable
    {{- if $p.tlsSecret }}
    - --tls-cert-file=/etc/kube-rbac-proxy/tls/tls.crt
    - --tls-private-key-file=/etc/kube-rbac-proxy/tls/tls.key
    {{- end }}
    {{- if $p.clientCAConfigMap }}
    - --client-ca-file=/etc/kube-rbac-proxy/client-ca/ca.crt
    {{- end }}
  ports:
    - name: metrics
      containerPort: {{ .port }}
  securityContext:
    runAsNonRoot: true
    runAsUser: 65532
    runAsGroup: 65532
    allowPrivilegeEscalation: false
    readOnlyRootFilesystem: true
    capabilities:
      drop: ["ALL"]
  {{- if or $p.tlsSecret $p.clientCAConfigMap }}
  volumeMounts:
    {{- if $p.tlsSecret }}
    - name: metrics-proxy-tls
      mountPath: /etc/kube-rbac-proxy/tls
      readOnly: true
    {{- end }}
    {{- if $p.clientCAConfigMap }}
    - name: metrics-proxy-client-ca
      mountPath: /etc/kube-rbac-proxy/client-ca
      readOnly: true
    {{- end }}
  {{- end }}
  {{- with $p.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}

{{/* The sidecar's volumes, as items of a volumes list (may be empty). */}}
{{- define "hami.metrics.proxyVolumes" -}}
{{- $p := .Values.metrics.kubeRbacProxy -}}
{{- if $p.tlsSecret }}
- name: metrics-proxy-tls
  secret:
    secretName: {{ $p.tlsSecret }}
{{- end }}
{{- if $p.clientCAConfigMap }}
- name: metrics-proxy-client-ca
  configMap:
    name: {{ $p.clientCAConfigMap }}
{{- end }}
{{- end -}}

{{/* Extra fields of a ServiceMonitor endpoint: HTTPS with Prometheus' own ServiceAccount token. */}}
{{- define "hami.metrics.scrapeAuth" -}}
{{- if include "hami.metrics.protected" . }}
scheme: https
bearerTokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token
tlsConfig:
  {{- with .Values.metrics.kubeRbacProxy.scrapeTLSConfig }}
  {{- toYaml . | nindent 2 }}
  {{- else }}
  # the proxy's certificate is self-signed (unless metrics.kubeRbacProxy.tlsSecret): the token and the
  # proxy's RBAC check are the protection, the channel is encrypted either way
  insecureSkipVerify: true
  {{- end }}
{{- end }}
{{- end -}}
