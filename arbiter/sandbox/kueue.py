"""Kueue's manager, built from the wrapper module `sandbox/kueue/` into the
sandbox's version-keyed cache (`controllers`), for `bench/compare_kueue.py`
only: never the default test command, a cold build takes 7-19 minutes on
two cores. `arbiter sandbox build --with kueue` fills it.
"""

from __future__ import annotations

from arbiter.sandbox.controllers import KUEUE, ControllerBuild, ensure_controller_built

KueueBuild = ControllerBuild


def ensure_kueue_built(*, force: bool = False) -> ControllerBuild:
    """The cached Kueue build, made first when it is not there yet."""
    return ensure_controller_built(KUEUE, force=force)
