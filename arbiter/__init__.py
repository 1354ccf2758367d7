"""kube-arbiter: multi-tenant job queueing for Kubernetes."""

__version__ = "0.1.0"
