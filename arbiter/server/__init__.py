"""The server `arbiter serve` runs: the composition root (`app`), what every
surface and background task shares (`context`), the configuration (`config`)
and the debug API (`debug`)."""
