{{/* Chart name, truncated to the 63 characters a label value allows. */}}
{{- define "leaseq.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Resource name prefix: <release>-<chart>, or <release> when it already contains it. */}}
{{- define "leaseq.fullname" -}}
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

{{/* Name of one component's objects: <fullname>-<component>. */}}
{{- define "leaseq.componentName" -}}
{{- printf "%s-%s" (include "leaseq.fullname" .root | trunc 50 | trimSuffix "-") .component -}}
{{- end -}}

{{/* Labels every object carries. helm.sh/chart changes with each chart version, so it is
     never part of a selector (selectors are immutable). */}}
{{- define "leaseq.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/part-of: leaseq
{{ include "leaseq.selectorLabels" . }}
{{- end -}}

{{/* Selector labels: stable for the life of a release. */}}
{{- define "leaseq.selectorLabels" -}}
app.kubernetes.io/name: {{ include "leaseq.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* The leaseq image reference: digest wins over tag; the tag defaults to appVersion. */}}
{{- define "leaseq.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* The ServiceAccount of the operator. */}}
{{- define "leaseq.operatorServiceAccount" -}}
{{- include "leaseq.componentName" (dict "root" . "component" "operator") -}}
{{- end -}}

{{/* The ServiceAccount of workers, migration and test pods: no API rights at all. */}}
{{- define "leaseq.workloadServiceAccount" -}}
{{- include "leaseq.componentName" (dict "root" . "component" "workload") -}}
{{- end -}}

{{/* Secret holding the database URL: existingSecret, else <fullname>-database (created by
     the chart from database.url or for the in-cluster PostgreSQL, else by the user). */}}
{{- define "leaseq.databaseSecret" -}}
{{- if .Values.database.existingSecret -}}
{{- .Values.database.existingSecret -}}
{{- else -}}
{{- include "leaseq.componentName" (dict "root" . "component" "database") -}}
{{- end -}}
{{- end -}}

{{/* Whether the chart creates the database Secret. */}}
{{- define "leaseq.createDatabaseSecret" -}}
{{- if and (not .Values.database.existingSecret) (or .Values.database.url .Values.postgresql.enabled) -}}true{{- end -}}
{{- end -}}

{{/* Whether the console connects as the demo PostgreSQL's own console role
     (postgresql.consoleUser): the console is on, the demo PostgreSQL runs with the Secret the
     chart creates, and no Secret of the console's own was given. */}}
{{- define "leaseq.demoConsoleRole" -}}
{{- if and .Values.console.enabled .Values.postgresql.enabled (not .Values.database.console.existingSecret) (include "leaseq.createDatabaseSecret" .) -}}true{{- end -}}
{{- end -}}

{{/* Host name of the in-cluster PostgreSQL Service. */}}
{{- define "leaseq.postgresqlHost" -}}
{{- include "leaseq.componentName" (dict "root" . "component" "postgresql") -}}
{{- end -}}

{{/* LEASEQ_DATABASE_URL: the one variable every leaseq process (and the helm test Pod)
     reads. Each component reads its own Secret when database.<component>.existingSecret
     names one (production: one database role per component), else the shared database
     Secret (demos). The component is the including template's file: migration-job.yaml is
     the migration, operator.yaml the operator, console.yaml the console, anything else (worker.yaml, the test Pod)
     the worker. */}}
{{- define "leaseq.databaseEnv" -}}
{{- $file := base .Template.Name -}}
{{- $byFile := dict "migration-job.yaml" "migration" "operator.yaml" "operator" "console.yaml" "console" -}}
{{- $component := get $byFile $file | default "worker" -}}
{{- $own := (index .Values.database $component).existingSecret -}}
{{- if and (eq $component "console") (not $own) (not (include "leaseq.demoConsoleRole" .)) -}}
{{- fail "console.enabled needs database.console.existingSecret: a Secret with the URL of the console's own database role (granted through database.roles.console). The chart never gives the console the shared database URL, which is the tables' owner: no row policy or grant would hold it (docs/guides/console.md)" -}}
{{- end -}}
- name: LEASEQ_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ $own | default (include "leaseq.databaseSecret" .) }}
      {{- if and (eq $component "console") (not $own) }}
      key: console-url
      {{- else }}
      key: {{ .Values.database.secretKey }}
      {{- end }}
{{- end -}}

{{/* The database roles `leaseq migrate` grants each component's privileges to (empty: no
     grants; everything then runs as the migration's user). */}}
{{- define "leaseq.grantEnv" -}}
{{- range $component, $role := .Values.database.roles }}
{{- if $role }}
- name: LEASEQ_{{ upper $component }}_ROLE
  value: {{ $role | quote }}
{{- end }}
{{- end }}
{{- if include "leaseq.demoConsoleRole" . }}
{{- if not .Values.database.roles.console }}
- name: LEASEQ_CONSOLE_ROLE
  value: {{ .Values.postgresql.consoleUser | quote }}
{{- end }}
{{- end }}
{{- if or .Values.database.roles.console (include "leaseq.demoConsoleRole" .) }}
- name: LEASEQ_CONSOLE_ADMIN
  value: {{ .Values.console.admin | quote }}
{{- end }}
{{- end -}}

{{/* Environment of the long-running roles (worker, operator): database URL, logging, metrics
     port. `leaseq migrate` reads only the database URL. */}}
{{- define "leaseq.commonEnv" -}}
{{ include "leaseq.databaseEnv" . }}
- name: LEASEQ_LOG_LEVEL
  value: {{ .Values.logLevel | quote }}
- name: LEASEQ_LOG_FORMAT
  value: {{ .Values.logFormat | quote }}
- name: LEASEQ_METRICS_PORT
  value: {{ .Values.metricsPort | quote }}
- name: LEASEQ_METRICS_ADDRESS
  value: {{ .Values.metricsAddress | quote }}
{{- end -}}

{{/* Pod-level security context of every leaseq pod. */}}
{{- define "leaseq.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .Values.runAsUser }}
runAsGroup: {{ .Values.runAsGroup }}
fsGroup: {{ .Values.runAsGroup }}
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* Container-level security context of every container the chart runs. */}}
{{- define "leaseq.containerSecurityContext" -}}
runAsNonRoot: true
readOnlyRootFilesystem: true
allowPrivilegeEscalation: false
privileged: false
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* PromQL matcher that scopes the alerts to this release. */}}
{{- define "leaseq.alertMatcher" -}}
{{- .Values.alerts.matcher | default (printf "namespace=%q" .Release.Namespace) -}}
{{- end -}}

{{/* The alert rules, rendered once from alerts/leaseq.rules.yaml (the single source for
     the PrometheusRule and the Grafana-provisioned rules). */}}
{{- define "leaseq.alertRules" -}}
{{- tpl (.Files.Get "alerts/leaseq.rules.yaml") . -}}
{{- end -}}

{{/* Refuse settings that would break the drain guarantee, leases or the reaper's lease. */}}
{{- define "leaseq.validate" -}}
{{- $w := .Values.worker -}}
{{- if $w.enabled -}}
{{- $need := add $w.drainSeconds $w.terminationGraceMarginSeconds -}}
{{- if lt (int $w.terminationGracePeriodSeconds) (int $need) -}}
{{- fail (printf "worker.terminationGracePeriodSeconds (%d) must be at least worker.drainSeconds + worker.terminationGraceMarginSeconds (%d + %d = %d): Kubernetes would kill draining workers before they release their jobs" (int $w.terminationGracePeriodSeconds) (int $w.drainSeconds) (int $w.terminationGraceMarginSeconds) (int $need)) -}}
{{- end -}}
{{- if ge (float64 $w.heartbeatSeconds) (float64 $w.leaseSeconds) -}}
{{- fail (printf "worker.heartbeatSeconds (%v) must be below worker.leaseSeconds (%v), or every lease expires between two heartbeats" $w.heartbeatSeconds $w.leaseSeconds) -}}
{{- end -}}
{{- $late := mulf (float64 $.Values.alerts.missedHeartbeats) (float64 $w.heartbeatSeconds) -}}
{{- if ge $late (float64 $w.leaseSeconds) -}}
{{- fail (printf "alerts.missedHeartbeats x worker.heartbeatSeconds (%v x %v = %v) must be below worker.leaseSeconds (%v): LeaseqHeartbeatLate would fire only after the lease is lost" $.Values.alerts.missedHeartbeats $w.heartbeatSeconds $late $w.leaseSeconds) -}}
{{- end -}}
{{- if lt (int $w.pool.maxReplicas) (int $w.pool.minReplicas) -}}
{{- fail (printf "worker.pool.maxReplicas (%d) must be >= worker.pool.minReplicas (%d)" (int $w.pool.maxReplicas) (int $w.pool.minReplicas)) -}}
{{- end -}}
{{- if le (float64 $w.pool.work.targetSeconds) (float64 $w.pool.work.startupSeconds) -}}
{{- fail (printf "worker.pool.work.targetSeconds (%v) must be greater than worker.pool.work.startupSeconds (%v): a new pod must be able to work before the target" $w.pool.work.targetSeconds $w.pool.work.startupSeconds) -}}
{{- end -}}
{{- end -}}
{{- $op := .Values.operator -}}
{{- if and $op.enabled (le (float64 $op.leaderTtlSeconds) (float64 $op.reapIntervalSeconds)) -}}
{{- fail (printf "operator.leaderTtlSeconds (%v) must be longer than operator.reapIntervalSeconds (%v): the leader renews its lease once per pass, so it would lapse between passes and the reaper would change hands all the time" $op.leaderTtlSeconds $op.reapIntervalSeconds) -}}
{{- end -}}
{{- end -}}

{{/* Whether to install the operator's ValidatingAdmissionPolicy: asked for, and the cluster
     serves admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy (Kubernetes >= 1.30). */}}
{{- define "leaseq.admissionPolicy" -}}
{{- $ap := .Values.operator.admissionPolicy -}}
{{- if and .Values.operator.enabled $ap.enabled -}}
{{- if or (.Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy") (semverCompare ">=1.30-0" .Capabilities.KubeVersion.Version) -}}true{{- end -}}
{{- end -}}
{{- end -}}

{{- /* The Deployments a namespaced operator may read, resume and scale, as a JSON list: the
       chart's worker Deployment (when worker.enabled) and operator.deployments. The Role
       names them (resourceNames) and the scale admission policy refuses any other target. */}}
{{- define "leaseq.scaledDeployments" -}}
{{- $names := list -}}
{{- if .Values.worker.enabled -}}
{{- $names = append $names (include "leaseq.componentName" (dict "root" . "component" "worker")) -}}
{{- end -}}
{{- range .Values.operator.deployments -}}
{{- $names = append $names . -}}
{{- end -}}
{{- $names | uniq | toJson -}}
{{- end }}
