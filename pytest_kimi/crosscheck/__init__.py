"""Checks of the client's figures against what the server itself counts (Prometheus /metrics)."""
