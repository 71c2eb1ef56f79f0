"""The kubelet HTTP API (Quart-Trio on Hypercorn): 10250, read-only 10255, healthz 10248."""
