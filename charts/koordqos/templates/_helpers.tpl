{{/* Chart name, possibly overridden. */}}
{{- define "koordqos.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Fully qualified name: the release name, suffixed with the chart name unless it already contains it. */}}
{{- define "koordqos.fullname" -}}
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

{{/* Labels that select the agent pods (stable across upgrades). */}}
{{- define "koordqos.selectorLabels" -}}
app.kubernetes.io/name: {{ include "koordqos.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Labels on every object. */}}
{{- define "koordqos.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "koordqos.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: node-agent
{{- end -}}

{{/* The ServiceAccount the agent runs as. */}}
{{- define "koordqos.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "koordqos.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The NRI plugin index as two digits: "7" or 7 -> "07"; anything else is left for the CLI to reject. */}}
{{- define "koordqos.nriPluginIndex" -}}
{{- $idx := .Values.agent.nri.pluginIndex -}}
{{- if kindIs "string" $idx -}}
{{- if regexMatch "^[0-9]$" $idx -}}{{ printf "0%s" $idx }}{{- else -}}{{ $idx }}{{- end -}}
{{- else -}}
{{- printf "%02d" (int $idx) -}}
{{- end -}}
{{- end -}}

{{/* --feature-gates value: the map sorted by name, A=true,B=false. */}}
{{- define "koordqos.featureGates" -}}
{{- $values := deepCopy .Values.agent.featureGates -}}
{{- if and (not .Values.report.nodeResourceTopology.enabled) (not (hasKey $values "NodeTopologyReport")) -}}
{{- $_ := set $values "NodeTopologyReport" false -}}
{{- end -}}
{{- $gates := list -}}
{{- range $name := keys $values | sortAlpha -}}
{{- $gates = append $gates (printf "%s=%t" $name (index $values $name)) -}}
{{- end -}}
{{- join "," $gates -}}
{{- end -}}

{{/* Whether the metrics Service is rendered (asked for, or needed by the ServiceMonitor). */}}
{{- define "koordqos.metricsService" -}}
{{- if or .Values.metrics.service.enabled .Values.metrics.serviceMonitor.enabled -}}true{{- end -}}
{{- end -}}

{{/* Container resources: `resources` as given, else the `sizing.presets` row for `sizing.pods`. */}}
{{- define "koordqos.resources" -}}
{{- if .Values.resources -}}
{{- toYaml .Values.resources -}}
{{- else -}}
{{- $row := index .Values.sizing.presets (toString (int .Values.sizing.pods)) -}}
{{- if not $row -}}
{{- fail (printf "sizing.pods %v has no row in sizing.presets" .Values.sizing.pods) -}}
{{- end -}}
{{- toYaml $row -}}
{{- end -}}
{{- end -}}
