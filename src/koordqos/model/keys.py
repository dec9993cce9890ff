"""Well-known names on a pod: Koordinator labels and annotations, and the extended resource names.

The formats behind these keys are in docs/behaviour-runtime-hooks.md, "Keys the agent reads"; their parsers
are in `koordqos.model.pod_annotations`.
"""

from __future__ import annotations

# -- labels ------------------------------------------------------------------------------------------------
LABEL_QOS = "koordinator.sh/qosClass"
LABEL_PRIORITY_CLASS = "koordinator.sh/priority-class"
LABEL_SUB_PRIORITY = "koordinator.sh/priority"
LABEL_EVICTION_ENABLED = "koordinator.sh/eviction-enabled"
LABEL_CORE_SCHED_GROUP_ID = "koordinator.sh/core-sched-group-id"
LABEL_CORE_SCHED_POLICY = "koordinator.sh/core-sched-policy"
LABEL_SKIP_HOOKSERVER = "runtimeproxy.koordinator.sh/skip-hookserver"

# -- annotations -------------------------------------------------------------------------------------------
ANNOTATION_EVICTION_PRIORITY = "koordinator.sh/eviction-priority"
ANNOTATION_EVICTION_POLICY = "koordinator.sh/eviction-policy"
ANNOTATION_RESOURCE_STATUS = "scheduling.koordinator.sh/resource-status"
ANNOTATION_EXTENDED_RESOURCE_SPEC = "node.koordinator.sh/extended-resource-spec"
ANNOTATION_CPU_QOS = "koordinator.sh/cpuQOS"
ANNOTATION_MEMORY_QOS = "koordinator.sh/memoryQOS"
ANNOTATION_CPU_BURST = "koordinator.sh/cpuBurst"
ANNOTATION_OOM_SCORE_ADJ = "koordinator.sh/oom-score-adj"
ANNOTATION_OOM_SCORE_ADJ_SPEC = "koordinator.sh/oom-score-adj-spec"
ANNOTATION_RESCTRL = "node.koordinator.sh/resctrl"
ANNOTATION_BLKIO_QOS = "koordinator.sh/blkioQOS"
ANNOTATION_NETWORK_QOS = "koordinator.sh/networkQOS"
ANNOTATION_DEVICE_ALLOCATED = "scheduling.koordinator.sh/device-allocated"
ANNOTATION_DOCKER_TYPE = "io.kubernetes.docker.type"

# -- extended resources (container requests/limits, NUMA allocations) --------------------------------------
BATCH_CPU = "kubernetes.io/batch-cpu"
BATCH_MEMORY = "kubernetes.io/batch-memory"
MID_CPU = "kubernetes.io/mid-cpu"
MID_MEMORY = "kubernetes.io/mid-memory"
