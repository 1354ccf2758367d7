"""`python -m arbiter` is the same as the `arbiter` console script."""

from arbiter.cli.main import main

raise SystemExit(main())
