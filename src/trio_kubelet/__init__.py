"""trio-kubelet: a Kubernetes node agent on trio."""

__version__ = "0.1.0"
