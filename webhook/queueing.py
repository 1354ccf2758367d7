"""Queue resolution and the denials shared by the pod, Job, QueueUnit and
JobFlow webhooks. The resolver itself is `ClusterStore.resolve_queue` (the one
shared with the admission loop); this module only explains its answer."""

from __future__ import annotations

from collections.abc import Mapping

from arbiter.api import QUEUE_LABEL
from arbiter.cache.store import ClusterStore, Kind
from arbiter.cache.store import no_queue_message as no_queue_message  # shared with the extender
from webhook.review import ALLOW, AdmissionEnv, Decision, deny

# What the pod, Job and JobFlow webhooks read: a decision taken before
# these kinds were listed once could deny work against a Queue that exists.
QUEUE_KINDS: tuple[Kind, ...] = ("Queue", "Namespace")


def not_ready(env: AdmissionEnv, kinds: tuple[Kind, ...]) -> Decision | None:
    """A retryable denial while the cache has not listed `kinds` yet."""
    missing = [kind for kind in kinds if kind not in env.store.synced_kinds]
    if not missing:
        return None
    return deny(
        f"kube-arbiter is starting and has not loaded {', '.join(missing)} objects yet; "
        "retry in a few seconds",
        code=503,
    )


def _source(store: ClusterStore, namespace: str, labels: Mapping[str, str] | None,
            queue: str, what: str) -> str:
    if labels and labels.get(QUEUE_LABEL) == queue:
        return f"the {what}'s {QUEUE_LABEL} label"
    if store.queue_by_namespace.get(namespace) == queue:
        return f'Queue "{queue}" listing namespace "{namespace}"'
    return f'namespace "{namespace}"\'s {QUEUE_LABEL} label'


def check_new_work(
    env: AdmissionEnv,
    namespace: str,
    labels: Mapping[str, str] | None,
    what: str,
) -> Decision:
    """Validate new work (a pod, a Job) in a managed namespace: a retryable
    denial until the cache has listed QUEUE_KINDS, then a denial unless its
    queue resolves, exists and is Open."""
    waiting = not_ready(env, QUEUE_KINDS)
    if waiting is not None:
        return waiting
    queue = env.store.resolve_queue(namespace, labels)
    if queue is None:
        return deny(no_queue_message(namespace, what))
    return check_open(env, queue, namespace, labels, what) or ALLOW


def check_open(
    env: AdmissionEnv,
    queue: str,
    namespace: str,
    labels: Mapping[str, str] | None,
    what: str,
) -> Decision | None:
    """Deny new work for a queue that does not exist or is Closed."""
    source = _source(env.store, namespace, labels, queue, what)
    return queue_denial(env.store, queue, f'queue "{queue}" (from {source})')


def queue_denial(store: ClusterStore, queue: str, subject: str) -> Decision | None:
    """Deny new work for `queue` when it does not exist, is a parent (DESIGN
    §11) or is Closed; the message starts with `subject` (which names the queue)."""
    record = store.queues.get(queue)
    if record is None:
        return deny(
            f"{subject} does not exist: create it, or use an existing queue (kubectl get queues)"
        )
    children = store.queue_children.get(queue)
    if children:
        names = sorted(children)
        shown = ", ".join(f'"{child}"' for child in names[:5])
        more = f" and {len(names) - 5} more" if len(names) > 5 else ""
        return deny(
            f"{subject} is a parent queue and holds no work of its own: use one of its "
            f"children ({shown}{more})"
        )
    if record.state == "Closed":
        return deny(
            f"{subject} is Closed and accepts no new work: reopen it (spec.state: Open) or use "
            "another queue"
        )
    return None
