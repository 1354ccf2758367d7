"""Queue resolution and the denials shared by the pod, Job and QueueUnit
webhooks. The resolver itself is `ClusterStore.resolve_queue` (the one
shared with the admission loop); this module only explains its answer."""

from __future__ import annotations

from collections.abc import Mapping

from arbiter.cache.records import QUEUE_LABEL
from arbiter.cache.store import ClusterStore, Kind
from webhook.review import AdmissionEnv, Decision, deny

# What the pod and Job webhooks read: a decision taken before these kinds
# were listed once could deny work against a Queue that exists.
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


def no_queue_message(namespace: str, what: str) -> str:
    return (
        f'namespace "{namespace}" has no queue: label the {what} or namespace with '
        f'{QUEUE_LABEL}=<queue>, or list "{namespace}" in a Queue\'s spec.namespaces'
    )


def check_queue(
    env: AdmissionEnv,
    namespace: str,
    labels: Mapping[str, str] | None,
    what: str,
) -> tuple[str | None, Decision | None]:
    """Resolve the queue for new work; (queue, None) or (None|queue, denial)."""
    store = env.store
    queue = store.resolve_queue(namespace, labels)
    if queue is None:
        return None, deny(no_queue_message(namespace, what))
    return queue, check_open(env, queue, namespace, labels, what)


def check_open(
    env: AdmissionEnv,
    queue: str,
    namespace: str,
    labels: Mapping[str, str] | None,
    what: str,
) -> Decision | None:
    """Deny new work for a queue that does not exist or is Closed."""
    store = env.store
    record = store.queues.get(queue)
    source = _source(store, namespace, labels, queue, what)
    if record is None:
        return deny(
            f'queue "{queue}" (from {source}) does not exist: create it, or use an existing '
            "queue (kubectl get queues)"
        )
    if record.state == "Closed":
        return deny(
            f'queue "{queue}" (from {source}) is Closed and accepts no new work: reopen it '
            "(spec.state: Open) or use another queue"
        )
    return None
