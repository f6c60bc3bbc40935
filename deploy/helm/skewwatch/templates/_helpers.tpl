{{- define "skewwatch.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}{{ .Release.Name | trunc 63 | trimSuffix "-" }}{{- else -}}{{ printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}{{- end -}}
{{- end -}}

{{- define "skewwatch.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "skewwatch.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "skewwatch.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "skewwatch.kafkaSecret" -}}
{{ .Values.kafka.existingSecret | default (printf "%s-kafka" (include "skewwatch.fullname" .)) }}
{{- end -}}

{{- define "skewwatch.apiSecret" -}}
{{ .Values.api.existingSecret | default (printf "%s-api" (include "skewwatch.fullname" .)) }}
{{- end -}}

{{/* Environment every skewwatch container gets: Kafka, its credentials, the config file. */}}
{{- define "skewwatch.env" -}}
- name: KAFKA_BOOTSTRAP
  value: {{ .Values.kafka.bootstrap | quote }}
- name: SKEWWATCH_CONFIG
  value: /etc/skewwatch/skewwatch.toml
{{- if ne .Values.kafka.securityProtocol "PLAINTEXT" }}
- name: SKEWWATCH_KAFKA__SECURITY_PROTOCOL
  value: {{ .Values.kafka.securityProtocol | quote }}
{{- if hasPrefix "SASL" .Values.kafka.securityProtocol }}
- name: SKEWWATCH_KAFKA__SASL_MECHANISM
  value: {{ .Values.kafka.saslMechanism | quote }}
- name: SKEWWATCH_KAFKA__SASL_USERNAME
  value: {{ .Values.kafka.saslUsername | quote }}
- name: SKEWWATCH_KAFKA_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "skewwatch.kafkaSecret" . }}
      key: sasl-password
{{- end }}
{{- if .Values.kafka.tls.caCert }}
- name: SKEWWATCH_KAFKA__SSL_CAFILE
  value: /etc/skewwatch/kafka/ca.crt
{{- end }}
{{- end }}
{{- end -}}

{{- define "skewwatch.volumeMounts" -}}
- name: tmp
  mountPath: /tmp
- name: config
  mountPath: /etc/skewwatch/skewwatch.toml
  subPath: skewwatch.toml
  readOnly: true
{{- if .Values.kafka.tls.caCert }}
- name: kafka-credentials
  mountPath: /etc/skewwatch/kafka
  readOnly: true
{{- end }}
{{- end -}}

{{- define "skewwatch.volumes" -}}
- name: tmp
  emptyDir:
    sizeLimit: 256Mi
- name: config
  configMap:
    name: {{ include "skewwatch.fullname" . }}
{{- if .Values.kafka.tls.caCert }}
- name: kafka-credentials
  secret:
    secretName: {{ include "skewwatch.kafkaSecret" . }}
    items:
      - key: ca.crt
        path: ca.crt
{{- end }}
{{- end -}}
