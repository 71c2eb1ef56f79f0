"""The kubelet HTTP API (Quart-Trio apps on our own server): 10250, 10255 (read-only), 10248."""
