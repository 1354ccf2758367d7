"""Every `arbiter` command: `main` parses the command line and dispatches to
`serve`, `queues`, `approve` (and reject), `demo` and `fairshare` (with its
scenario files and its reclaim fixpoint). The JobFlow and sandbox commands live
in their own packages (`arbiter.jobflow.cli`, `arbiter.sandbox.cli`)."""
