"""Container lifecycle hooks: running one postStart or preStop handler (lifecycle/handlers.go).

exec goes through CRI ExecSync and httpGet from the node, with the prober's runners
(``probes/prober.py``); sleep sleeps. A hook has no time limit of its own, as in Go:
the worker bounds preStop by the grace period, and postStart takes as long as it takes.
An HTTP hook fails only when no answer comes; any status code counts as done.
"""

from __future__ import annotations

import httpx
import trio

from trio_kubelet.model.pod import Container, ExecAction, HTTPGetAction, LifecycleHandler, Pod
from trio_kubelet.node.registration import KUBERNETES_VERSION
from trio_kubelet.probes.prober import (
    ProbeError,
    RedirectLimitError,
    exec_in_container,
    get_within_host,
    http_headers,
    http_url,
    node_http_client,
    request_url,
    resolve_port,
)
from trio_kubelet.runtime.client import CRIClient

USER_AGENT = "kube-lifecycle/" + KUBERNETES_VERSION.removeprefix("v").rsplit(".", 1)[0]


async def run_hook(
    cri: CRIClient,
    handler: LifecycleHandler,
    pod: Pod,
    container: Container,
    container_id: str,
    pod_ip: str,
) -> str | None:
    """Run ``handler`` for the instance ``container_id``: None when it succeeded, else why not."""
    where = f'container "{container.name}" in pod "{pod.full_name}({pod.metadata.uid})"'
    if handler.exec is not None:
        return await _exec(cri, handler.exec, container_id, where)
    if handler.http_get is not None:
        return await _http_get(handler.http_get, container, pod_ip, where)
    if handler.sleep is not None:
        await trio.sleep(handler.sleep.seconds)
        return None
    # tcpSocket: the API still accepts it, but no kubelet runs it; it fails at run time.
    return f"Cannot run the lifecycle hook of {where}: tcpSocket is not a supported handler"


async def _exec(cri: CRIClient, action: ExecAction, container_id: str, where: str) -> str | None:
    command = action.command
    try:
        answer = await exec_in_container(cri, container_id, command, 0)
    except ProbeError as err:
        error, output = str(err), ""
    else:
        if answer.exit_code == 0:
            return None
        error = f"command {' '.join(command)!r} exited with {answer.exit_code}"
        output = answer.output
    return f"Exec lifecycle hook {command} for {where} failed - error: {error}, output: {output!r}"


async def _http_get(
    action: HTTPGetAction, container: Container, pod_ip: str, where: str
) -> str | None:
    failed = f"HTTP lifecycle hook ({action.path}) for {where} failed - error:"
    host = action.host or pod_ip
    if not host:
        return f"{failed} the pod has no IP to send it to"
    try:
        url = http_url(action, host, resolve_port(action.port, container))
    except ProbeError as err:
        return f"{failed} {err}"
    try:
        async with node_http_client() as http:
            await get_within_host(http, url, http_headers(action, USER_AGENT))
    except RedirectLimitError as err:
        return f'{failed} Get "{url}": {err}'
    except httpx.HTTPError as err:
        return f'{failed} Get "{request_url(err, url)}": {err or type(err).__name__}'
    return None
