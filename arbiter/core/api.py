"""The `arbiter.dev` API's names, in one place: group and version, kinds and
their REST collections, the labels, annotations and scheduling gate arbiter
reads and writes, QueueUnit phases, QueueUnit naming and the wire format of
times.

Part of the pure core layer: it imports no I/O library and nothing from the
cache, the loop or the surfaces, so the webhook, the extender, JobFlow and
the CLIs take names from here without pulling in the cache.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from dataclasses import dataclass
from typing import Final, Literal

# -- group and version ----------------------------------------------------------------
API_GROUP: Final = "arbiter.dev"
VERSION: Final = "v1alpha1"
# An object's apiVersion field.
API_VERSION: Final = f"{API_GROUP}/{VERSION}"
# The REST path every arbiter.dev collection lives under.
API_PATH: Final = f"/apis/{API_VERSION}"

# -- kinds ----------------------------------------------------------------------------
ArbiterKind = Literal["Queue", "QueueUnit", "JobFlow", "JobTemplate", "Pool", "AdmissionCheck"]


@dataclass(frozen=True, slots=True)
class ApiKind:
    kind: ArbiterKind
    # The REST collection's name (the CRD's plural).
    plural: str
    namespaced: bool

    @property
    def path(self) -> str:
        """The cluster-wide collection: every object, of every namespace."""
        return f"{API_PATH}/{self.plural}"


QUEUE: Final = ApiKind("Queue", "queues", namespaced=False)
QUEUE_UNIT: Final = ApiKind("QueueUnit", "queueunits", namespaced=True)
JOB_FLOW: Final = ApiKind("JobFlow", "jobflows", namespaced=True)
JOB_TEMPLATE: Final = ApiKind("JobTemplate", "jobtemplates", namespaced=True)
# A named set of nodes admission places work into (DESIGN §10).
POOL: Final = ApiKind("Pool", "pools", namespaced=False)
# A gate a unit passes after its quota is reserved, before its work starts (§12).
ADMISSION_CHECK: Final = ApiKind("AdmissionCheck", "admissionchecks", namespaced=False)
API_KINDS: Final = (QUEUE, QUEUE_UNIT, JOB_FLOW, JOB_TEMPLATE, POOL, ADMISSION_CHECK)

# -- labels, annotations, the scheduling gate -----------------------------------------
# A table, not repeated logic: one constant per key, spelled in full so that
# a search for the key lands here.
# On pods, Jobs, JobFlows, QueueUnits and namespaces: the queue the work is in.
QUEUE_LABEL: Final = "arbiter.dev/queue"
# On a namespace: "false" takes it out of arbiter's hands; "true" puts it
# in them under `--managed-namespaces listed` (DESIGN §3).
MANAGED_LABEL: Final = "arbiter.dev/managed"
# On a namespace: arbiter itself set MANAGED_LABEL "true" (a Queue admits
# the namespace), so it may remove it again; an admin's label it never touches.
MANAGED_BY_ARBITER_ANNOTATION: Final = "arbiter.dev/managed-label-by"
ManagedNamespaces = Literal["all", "listed"]
MANAGED_NAMESPACE_MODES: tuple[ManagedNamespaces, ...] = ("all", "listed")
# Pods with the same value form one QueueUnit, created once as many gated
# pods as the size annotation says are present.
POD_GROUP_LABEL: Final = "arbiter.dev/pod-group"
POD_GROUP_SIZE_ANNOTATION: Final = "arbiter.dev/pod-group-size"
# The scheduling gate that holds a plain pod until its unit is admitted.
ADMISSION_GATE: Final = "arbiter.dev/admission"
# On a QueueUnit the loop creates: its consumer's kind (Job, Pod, PodGroup).
CONSUMER_KIND_LABEL: Final = "arbiter.dev/consumer-kind"
# On a Job arbiter released into a pool: the nodeSelector keys and
# tolerations it added to the pod template, taken off at the next release.
PLACED_ANNOTATION: Final = "arbiter.dev/placed"
# On a QueueUnit the loop created admitted (the fast path, DESIGN §16): the
# status of that admission, standing where the status has nothing yet.
ADMITTED_STATUS_ANNOTATION: Final = "arbiter.dev/admitted-status"
# On a JobFlow's Jobs: labels to select them by, annotations because the
# cache's JobRecord keeps a Job's arbiter.dev/ annotations (not its labels).
FLOW_LABEL: Final = "arbiter.dev/jobflow"
STEP_LABEL: Final = "arbiter.dev/jobflow-step"
FLOW_ANNOTATION: Final = "arbiter.dev/jobflow"
FLOW_UID_ANNOTATION: Final = "arbiter.dev/jobflow-uid"
STEP_ANNOTATION: Final = "arbiter.dev/jobflow-step"
ATTEMPT_ANNOTATION: Final = "arbiter.dev/jobflow-attempt"
# On a Job: the fewest pods it may start with (partial admission, DESIGN §12).
MIN_PARALLELISM_ANNOTATION: Final = "arbiter.dev/min-parallelism"


def is_arbiter_key(key: str) -> bool:
    """Whether a label or annotation key is in arbiter's own prefix."""
    return key.startswith(f"{API_GROUP}/")


# -- Queue and QueueUnit fields -------------------------------------------------------
QueuePolicy = Literal["Priority", "FIFO"]
QueueState = Literal["Open", "Closed"]
WithinQueuePreemption = Literal["Never", "LowerPriority"]
UnitPhase = Literal[
    "Enqueued", "Reserved", "Dequeued", "Running", "Succeed", "Failed", "TimeoutBackoff"
]
# A QueueUnit holds 1..MAX_POD_SETS pod sets (the CRD enforces the same bound).
MAX_POD_SETS: Final = 8
# QueueUnit status.admission: where an admitted unit's pods go (DESIGN §10):
# {pool: NAME, nodes: {podSetName: [node, ...]}}, one node per pod.
ADMISSION_FIELD: Final = "admission"
ADMISSION_POOL: Final = "pool"
ADMISSION_NODES: Final = "nodes"
# AdmissionCheck (DESIGN §12): the built-in controller a person answers
# (`arbiter approve|reject`), a check's states on a unit, and its defaults.
APPROVAL_CONTROLLER: Final = "arbiter.dev/approval"
CheckState = Literal["Pending", "Ready", "Retry", "Rejected"]
CHECK_STATES: Final[tuple[CheckState, ...]] = ("Pending", "Ready", "Retry", "Rejected")
DEFAULT_RETRY_DELAY: Final = 60
ADMITTED_PHASES: frozenset[str] = frozenset({"Dequeued", "Running"})
FINISHED_PHASES: frozenset[str] = frozenset({"Succeed", "Failed"})

# -- QueueUnit names ------------------------------------------------------------------
# One unit per consumer: a Job `x` → `job-x`; a plain pod `p` → `pod-p`; a pod
# group `g` → `group-g`. The loop creates units under these names and the
# webhook (a Job may be unsuspended once `job-<name>` is admitted) and the
# extender (a pod's unit) find them by the same names, so a name longer than
# a QueueUnit may be is cut and hashed identically everywhere.
MAX_NAME: Final = 253


def unit_name(prefix: str, name: str) -> str:
    full = f"{prefix}-{name}"
    if len(full) <= MAX_NAME:
        return full
    digest = hashlib.sha256(full.encode()).hexdigest()[:10]
    return f"{full[: MAX_NAME - 11].rstrip('-.')}-{digest}"


def workload_unit_name(prefix: str, name: str, part: str = "") -> str:
    """An integration's unit: `<prefix>-<name>`, `-<part>` for one of several."""
    return unit_name(prefix, f"{name}-{part}" if part else name)


def job_unit_name(job: str) -> str:
    return unit_name("job", job)


def pod_unit_name(pod: str) -> str:
    return unit_name("pod", pod)


def group_unit_name(group: str) -> str:
    return unit_name("group", group)


# -- times (RFC 3339, as the API server writes them) ------------------------------------
def format_rfc3339(when: float) -> str:
    """Seconds since the epoch → `2006-01-02T15:04:05Z` (UTC, whole seconds)."""
    return dt.datetime.fromtimestamp(when, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: str | None) -> float:
    """RFC 3339 → seconds since the epoch; 0.0 when absent. A malformed value
    raises ValueError: converting an object, that rejects the object."""
    if not value:
        return 0.0
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def parse_rfc3339(value: str | None) -> float | None:
    """RFC 3339 → seconds since the epoch; None when absent or malformed, for
    a stamp that is consulted, not required."""
    if not value:
        return None
    try:
        return parse_time(value)
    except ValueError:
        return None


# -- resourceVersions -----------------------------------------------------------------
def compare_resource_versions(a: str, b: str) -> int | None:
    """-1, 0 or 1 as `a` is older than, the same as or newer than `b` (two
    versions of one resource); None when either is not a well-formed one.

    Kubernetes 1.35 made resourceVersions comparable (KEP-5504; the rule of
    apimachinery's `CompareResourceVersion`): a positive decimal integer
    without leading zeros, the longer string the newer. Anything else (an
    API server that still treats them as opaque) is not compared."""
    if not (_well_formed_version(a) and _well_formed_version(b)):
        return None
    if len(a) != len(b):
        return -1 if len(a) < len(b) else 1
    return (a > b) - (a < b)


def _well_formed_version(version: str) -> bool:
    return version.isascii() and version.isdigit() and version[0] != "0"
