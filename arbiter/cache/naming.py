"""QueueUnit names, one per consumer, shared by everything that looks one up.

The loop creates the units under these names; the webhook (a Job may be
unsuspended once `job-<name>` is admitted) and the extender (a pod's unit)
find them by the same names, so a long name is cut and hashed identically
everywhere.

- a Job `x` → `job-x`; a plain pod `p` → `pod-p`; a pod group `g` → `group-g`;
- a name longer than a QueueUnit may be (253) is cut and suffixed with a
  hash of the full name.
"""

from __future__ import annotations

import hashlib

MAX_NAME = 253


def unit_name(prefix: str, name: str) -> str:
    full = f"{prefix}-{name}"
    if len(full) <= MAX_NAME:
        return full
    digest = hashlib.sha256(full.encode()).hexdigest()[:10]
    return f"{full[: MAX_NAME - 11].rstrip('-.')}-{digest}"


def job_unit_name(job: str) -> str:
    return unit_name("job", job)


def pod_unit_name(pod: str) -> str:
    return unit_name("pod", pod)


def group_unit_name(group: str) -> str:
    return unit_name("group", group)
