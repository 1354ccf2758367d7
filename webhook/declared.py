"""The webhook's side of declared kinds (arbiter.integrations.declared):
their endpoints join the served table once at startup (so the server routes
them and `--webhook-url` installs their hooks), arbiter's own updates skip
their validating hook, and their unit prefix is the loop's (a tenant's
QueueUnit may not take it)."""

from __future__ import annotations

from collections.abc import Iterable

from arbiter.core.api import unit_name
from arbiter.integrations import Integration
from webhook import configuration, endpoints, queueunits


def register(integrations: Iterable[Integration], *, on: bool = True) -> None:
    """Serve these kinds' endpoints (`on=False`: no longer; tests)."""
    for integration in integrations:
        name = integration.name  # <resource>.<group>: its CRD's name
        hook = f"{name}.validate.arbiter.dev"
        prefix = unit_name(integration.prefix, "")
        served = [e for e in endpoints.DECLARED if e.kind == integration.kind]
        for endpoint in served:
            endpoints.DECLARED.remove(endpoint)
            endpoints.BY_PATH.pop(endpoint.path, None)
        configuration.OWN_WRITES_SKIP.pop(hook, None)
        queueunits.LOOP_PREFIXES = tuple(p for p in queueunits.LOOP_PREFIXES if p != prefix)
        if on:
            added = endpoints.workload_endpoints(integration, name)
            endpoints.DECLARED.extend(added)
            endpoints.BY_PATH.update({endpoint.path: endpoint for endpoint in added})
            # Unsuspending it and writing its placement (the loop's updates).
            configuration.OWN_WRITES_SKIP[hook] = "updates"
            queueunits.LOOP_PREFIXES = (*queueunits.LOOP_PREFIXES, prefix)
