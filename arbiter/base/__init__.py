"""Plumbing that every layer above the core shares: the Kubernetes API client
(`kubeapi`), Prometheus metrics (`metrics`), rate limits (`ratelimit`) and the
guarded HTTP listener (`httpserve`). It imports nothing first-party but the core."""
