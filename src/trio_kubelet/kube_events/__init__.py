"""Kubernetes Events from the kubelet: a pure correlator and a non-blocking recorder."""

from trio_kubelet.kube_events.correlator import EventType, ObjectRef, node_ref, pod_ref
from trio_kubelet.kube_events.recorder import EventRecorder

__all__ = ["EventRecorder", "EventType", "ObjectRef", "node_ref", "pod_ref"]
