"""Container environments on containerd: values, $(VAR) expansion, the downward API, and the
errors that keep one container waiting while the others run."""

from __future__ import annotations

import pytest

from tests.integration.harness import container, running, running_agent

pytestmark = pytest.mark.integration

ENV = """\
apiVersion: v1
kind: Pod
metadata: {name: env, labels: {tier: web}}
spec:
  restartPolicy: Never
  containers:
  - name: main
    image: busybox:1.36
    resources: {limits: {memory: 64Mi}, requests: {cpu: 250m}}
    env:
    - {name: GREETING, value: hello}
    - {name: MESSAGE, value: "$(GREETING) world, $$(GREETING) stays, $(UNDEFINED) too"}
    - name: POD_NAME
      valueFrom: {fieldRef: {fieldPath: metadata.name}}
    - name: TIER
      valueFrom: {fieldRef: {fieldPath: "metadata.labels['tier']"}}
    - name: POD_IP
      valueFrom: {fieldRef: {fieldPath: status.podIP}}
    - name: HOST_IP
      valueFrom: {fieldRef: {fieldPath: status.hostIP}}
    - name: MEMORY_MI
      valueFrom: {resourceFieldRef: {resource: limits.memory, divisor: 1Mi}}
    - name: CPU_MILLI
      valueFrom: {resourceFieldRef: {resource: requests.cpu, divisor: 1m}}
    command: ["sh", "-c"]
    args:
    - >-
      echo '$(MESSAGE)'; echo "$POD_NAME $TIER"; echo "$POD_IP"; echo "$HOST_IP";
      echo "$MEMORY_MI $CPU_MILLI"
"""


async def test_env_values_expansion_and_downward_api(containerd, tmp_path):
    async with running_agent(containerd.endpoint, tmp_path) as agent:
        agent.write("env.yaml", ENV)
        pod = await agent.wait_for("env", lambda p: p.status.phase in ("Succeeded", "Failed"))
        assert pod.status.phase == "Succeeded"
        message, names, pod_ip, host_ip, resources = agent.output(pod, "main")
        # $(VAR) in args is expanded by the agent, $$ escapes, undefined names stay as written.
        assert message == "hello world, $(GREETING) stays, $(UNDEFINED) too"
        assert names == f"{pod.metadata.name} web"
        assert pod_ip == pod.status.pod_ip and pod_ip.startswith("10.88.")
        assert host_ip == "127.0.0.1"
        assert resources == "64 250"


async def test_config_errors_keep_only_that_container_waiting(containerd, tmp_path):
    async with running_agent(containerd.endpoint, tmp_path) as agent:
        agent.write("errors.yaml", """\
            apiVersion: v1
            kind: Pod
            metadata: {name: errors}
            spec:
              containers:
              - name: needs-config
                image: busybox:1.36
                command: ["sleep", "3600"]
                env:
                - name: SETTING
                  valueFrom: {configMapKeyRef: {name: settings, key: level}}
              - name: root-refused
                image: busybox:1.36
                command: ["sleep", "3600"]
                securityContext: {runAsNonRoot: true}
              - name: fine
                image: busybox:1.36
                command: ["sleep", "3600"]
            """)

        def waiting(pod, name):
            state = container(pod, name).state.waiting
            return state is not None and state.reason == "CreateContainerConfigError"

        pod = await agent.wait_for("errors", lambda p: running(p, "fine")
                                   and waiting(p, "needs-config") and waiting(p, "root-refused"))
        config_message = container(pod, "needs-config").state.waiting.message
        assert "ConfigMap default/settings" in config_message, config_message
        root_message = container(pod, "root-refused").state.waiting.message
        assert root_message.startswith("container has runAsNonRoot and image will run as root")
