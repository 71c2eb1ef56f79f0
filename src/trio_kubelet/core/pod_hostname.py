"""A pod's hostname and DNS domain: the sandbox's UTS name and the names /etc/hosts gives it.

The Go kubelet's ``GeneratePodHostNameAndDomain`` (pkg/kubelet/kubelet_pods.go). The model
already rejects a ``spec.hostname`` or ``spec.subdomain`` that is not a DNS label, and a
``spec.hostnameOverride`` that is not a DNS subdomain, so here only the length can need care.
"""

from __future__ import annotations

from trio_kubelet.model.pod import Pod

# A kernel hostname holds 64 bytes including the terminating NUL.
HOSTNAME_MAX_LENGTH = 63


def pod_hostname(pod: Pod) -> str:
    """``spec.hostnameOverride``, else ``spec.hostname``, else the pod's name; cut to 63
    characters when longer.

    A cut name may end inside a label, so trailing '-' and '.' go too (a hostname
    must end with a letter or digit).
    """
    hostname = pod.spec.hostname_override or pod.spec.hostname or pod.metadata.name
    if len(hostname) <= HOSTNAME_MAX_LENGTH:
        return hostname
    return hostname[:HOSTNAME_MAX_LENGTH].rstrip("-.")


def pod_domain(pod: Pod, cluster_domain: str) -> str:
    """``<subdomain>.<namespace>.svc.<clusterDomain>`` for a pod with a subdomain, else "".

    With a subdomain a headless Service of that name gives the pod this DNS name. A
    ``hostnameOverride`` replaces the whole name, so the pod then has no domain.
    """
    subdomain = pod.spec.subdomain
    if not subdomain or pod.spec.hostname_override is not None:
        return ""
    return f"{subdomain}.{pod.metadata.namespace}.svc.{cluster_domain}"
