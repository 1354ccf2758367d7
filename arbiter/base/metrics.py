"""Every Prometheus metric arbiter exports (DESIGN.md §7), in one registry.

One module so that names, labels and buckets are defined once; components
import the metric objects they update.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)

_FAST_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0)
_WAIT_BUCKETS = (0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)

# Per queue.
queue_allocated = Gauge(
    "arbiter_queue_allocated",
    "Resources admitted to the queue (base units; cpu in cores)",
    ["queue", "resource"],
    registry=REGISTRY,
)
queue_deserved = Gauge(
    "arbiter_queue_deserved",
    "The queue's deserved share by weighted DRF (base units; cpu in cores)",
    ["queue", "resource"],
    registry=REGISTRY,
)
queue_unqueued = Gauge(
    "arbiter_queue_unqueued",
    "Requests of bound pods charged to the queue that no admitted unit covers "
    "(part of allocated; base units, cpu in cores)",
    ["queue", "resource"],
    registry=REGISTRY,
)
queue_dominant_share = Gauge(
    "arbiter_queue_dominant_share",
    "Dominant share of the queue (0..1)",
    ["queue"],
    registry=REGISTRY,
)
queue_info = Gauge(
    "arbiter_queue_info",
    "1 for each queue; `parent` names its parent queue (empty at the top, DESIGN §11)",
    ["queue", "parent"],
    registry=REGISTRY,
)
queue_pending_units = Gauge(
    "arbiter_queue_pending_units", "Units waiting for admission", ["queue"], registry=REGISTRY
)
api_requests_total = Counter(
    "arbiter_api_requests_total",
    "Requests arbiter's own writers and readers sent to the API server (not its watches)",
    ["verb"],
    registry=REGISTRY,
)
admitted_units_total = Counter(
    "arbiter_admitted_units_total", "Units admitted", ["queue"], registry=REGISTRY
)
admission_wait_seconds = Histogram(
    "arbiter_admission_wait_seconds",
    "Time from a unit's creation to its admission",
    ["queue"],
    buckets=_WAIT_BUCKETS,
    registry=REGISTRY,
)
preempted_units_total = Counter(
    "arbiter_preempted_units_total",
    "Admitted units taken back",
    ["queue", "reason"],
    registry=REGISTRY,
)

# Admission checks and partial admission (DESIGN §12).
admission_check_state = Gauge(
    "arbiter_admission_check_state",
    "Reserved units by admission check and the check's state on them",
    ["check", "state"],
    registry=REGISTRY,
)
partial_admissions_total = Counter(
    "arbiter_partial_admissions_total",
    "Units admitted with fewer pods than asked (at least their minCount)",
    ["queue"],
    registry=REGISTRY,
)

# Per pool (DESIGN §10).
pool_capacity = Gauge(
    "arbiter_pool_capacity",
    "Allocatable of the pool's Ready, schedulable nodes (base units; cpu in cores)",
    ["pool", "resource"],
    registry=REGISTRY,
)
pool_allocated = Gauge(
    "arbiter_pool_allocated",
    "Requests of admitted pods planned on the pool's nodes (base units; cpu in cores)",
    ["pool", "resource"],
    registry=REGISTRY,
)
unit_unplaceable_total = Counter(
    "arbiter_unit_unplaceable_total",
    "Units that fit the queue's share and the cluster in total but on no node of its pools",
    ["queue"],
    registry=REGISTRY,
)

# Server.
listener_connections_closed_total = Counter(
    "arbiter_listener_connections_closed_total",
    "Connections a listener closed by its limits (refused, evicted, handshake-failed, "
    "header-timeout)",
    ["listener", "reason"],
    registry=REGISTRY,
)
webhook_requests_total = Counter(
    "arbiter_webhook_requests_total",
    "AdmissionReviews answered",
    ["webhook", "operation", "allowed"],
    registry=REGISTRY,
)
webhook_rechecks_total = Counter(
    "arbiter_webhook_rechecks_total",
    "Denials resting on a record this replica's watch may not have delivered yet, decided "
    "again when it changed (outcome: decided, denied again, unchanged within the wait)",
    ["outcome"],
    registry=REGISTRY,
)
webhook_duration_seconds = Histogram(
    "arbiter_webhook_duration_seconds",
    "Server-side time to answer an AdmissionReview",
    ["webhook"],
    buckets=_FAST_BUCKETS,
    registry=REGISTRY,
)
extender_requests_total = Counter(
    "arbiter_extender_requests_total",
    "Scheduler extender calls",
    ["verb", "result"],
    registry=REGISTRY,
)
extender_duration_seconds = Histogram(
    "arbiter_extender_duration_seconds",
    "Server-side time to answer a scheduler extender call",
    ["verb"],
    buckets=_FAST_BUCKETS,
    registry=REGISTRY,
)
admission_cycle_duration_seconds = Histogram(
    "arbiter_admission_cycle_duration_seconds",
    "Time of one admission loop cycle",
    buckets=_FAST_BUCKETS,
    registry=REGISTRY,
)
event_loop_lag_seconds = Histogram(
    "arbiter_event_loop_lag_seconds",
    "How late a timer fires on the event loop: what a webhook or extender "
    "request waits before its handler starts",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
    registry=REGISTRY,
)
cache_objects = Gauge(
    "arbiter_cache_objects", "Objects held in the cluster cache", ["kind"], registry=REGISTRY
)
leader = Gauge("arbiter_leader", "1 while this replica holds the leader Lease", registry=REGISTRY)

# JobFlow.
jobflow_phase_total = Counter(
    "arbiter_jobflow_phase_total",
    "JobFlows that entered a phase",
    ["phase"],
    registry=REGISTRY,
)
jobflow_step_duration_seconds = Histogram(
    "arbiter_jobflow_step_duration_seconds",
    "Running time of a finished JobFlow step (its attempts' Jobs, start to finish)",
    buckets=_WAIT_BUCKETS,
    registry=REGISTRY,
)
