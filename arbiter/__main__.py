"""`python -m arbiter` is the same as the `arbiter` console script."""

from arbiter.cli import main

raise SystemExit(main())
