"""`arbiter fairshare FILE`: run the fair-share engine offline on a scenario.

The scenario (YAML or JSON, DESIGN.md §4):

    capacity: {cpu: "9", memory: 18Gi}
    queues:
      - name: A
        weight: 1                      # optional, positive integer
        guarantee: {}                  # optional
        capability: {}                 # optional
        blocking: false                # optional
        queuePolicy: Priority          # optional: Priority (default) | FIFO
        units:                         # in submission order
          - {count: 10, requests: {cpu: "1", memory: 4Gi}, priority: 0}

A unit entry may also carry a `name`; `count` (default 1) expands it into that
many identical units. Units are created in file order (creation time = index).
Every unit is offered to the engine, which admits until nothing fits; the
output is JSON:

    {"queues": {"A": {"admitted": 3, "allocated": {...}, "dominantShare": 0.6667,
                      "deserved": {...}}, ...},
     "free": {...}}

Quantities are canonical Kubernetes strings and list every resource of the
capacity (zeros included); shares are rounded to 4 places; `deserved` is
computed over each queue's total demand (all its units). Bad input exits 2
with one line on stderr naming the field.

Node fit (DESIGN.md §10), all optional; without `nodes` nothing changes:

    nodes:                             # instead of capacity
      - {name: gpu, count: 2, labels: {accel: a100}, allocatable: {cpu: "8", nvidia.com/gpu: 4}}
      - {name: cpu-node, allocatable: {cpu: "1"}, used: {cpu: 600m}}
    pools:
      - {name: gpu, nodeSelector: {accel: a100}}
    queues:
      - name: A
        pools: [gpu, default]          # preference (default: every pool by name, default last)
        nodeSelector: {zone: a}        # narrows the nodes further
        units:
          - {count: 3, pods: 2, requests: {cpu: "1"}}   # 3 units of 2 pods x 1 cpu

A node entry with `count: N` stands for N nodes named `<name>-0` ...
`<name>-<N-1>`; `used` is what already runs there. The capacity is then the
sum of allocatable - used over the nodes (a top-level `capacity` is refused),
and a unit is admitted only where all its pods (`pods` per unit, default 1,
each requesting `requests`) fit on the nodes of one of its queue's pools.
Each queue's output adds `pools` (admitted units per pool) and `waiting` (why
its first pending unit waits, e.g. the largest free slot on its nodes).

Hierarchical queues (DESIGN.md §11), on aggregate capacity (not with nodes):

    queues:
      - {name: org, capability: {cpu: "16"}}
      - {name: product, parent: org, childOrder: Queue}   # Fair (default) | Queue
      - {name: web, parent: product, units: [...]}

A queue with children holds no units. The engine then admits by H-DRF from
the top; each child's output adds `parent`, each parent's adds `subtree`
(its subtree's allocated, dominantShare and deserved). See
examples/hierarchy.yaml.
"""

from __future__ import annotations

import argparse
import json
import sys

from arbiter.cli import fairshare_reclaim
from arbiter.cli.fairshare_scenario import ScenarioError, evaluate, load_scenario, read_document


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "fairshare",
        help="run the fair-share engine offline on a scenario file",
        description=(
            "Admit a scenario's units with the weighted-DRF engine and print, per "
            "queue, what it gets (admitted, allocated, dominantShare, deserved) and "
            "what stays free, as JSON."
        ),
    )
    parser.add_argument("file", metavar="FILE", help="scenario, YAML or JSON ('-' = stdin)")
    parser.add_argument(
        "--order",
        action="store_true",
        help='also list the admitted units in admission order (key "order")',
    )
    parser.add_argument(
        "--from", dest="start", metavar="RUNNING",
        help="start from these running units ({QUEUE: [units]}; or list them as a queue's "
             "`running:`) and print the reclaim moves and the fixpoint",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    try:
        document = read_document(str(args.file))
        running = fairshare_reclaim.take_running(document)
        scenario = load_scenario(document)
        if args.start:
            running.update(fairshare_reclaim.read_from(str(args.start)))
        result = (fairshare_reclaim.settle(scenario, running) if running or args.start
                  else evaluate(scenario, order=bool(args.order)))
    except ScenarioError as exc:
        print(exc, file=sys.stderr)
        return 2
    sys.stdout.write(json.dumps(result, indent=2) + "\n")
    return 0
