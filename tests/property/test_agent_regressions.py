"""Bugs the agent state machine (test_agent_stateful.py) found, each as its smallest example.

Every test drives the whole agent (sync loop, pod workers, PLEG, CRI client) on the fake
runtime under trio's MockClock, like the state machine does. A test marked
``xfail(strict=True)`` shows a bug that is still open: fixing it turns the test into an
unexpected pass, which fails the run until the mark is removed.
"""

from __future__ import annotations

import pytest
import trio.testing
from agent_driver import Behaviour, ContainerPlan, PodPlan, open_node, put_pod

from trio_kubelet.core.hashing import container_hash
from trio_kubelet.model.pod import ContainerStatus
from trio_kubelet.runtime.cri.runtime import v1


def status_of(node_pod_status: list[ContainerStatus], name: str) -> ContainerStatus:
    return next(s for s in node_pod_status if s.name == name)


async def test_container_edited_at_the_instant_it_started_keeps_running(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Instances created at the same instant tie on created_at: the tie goes to the higher
    attempt, so the real newest instance is not killed as a stale one (found by hypothesis)."""
    async with open_node(autojump_clock) as node:
        await node.start_agent()
        plan = PodPlan("web", "Always", (ContainerPlan("main"),))
        uid = await put_pod(node, plan)
        edited = plan.with_container(ContainerPlan("main", version=1))
        await put_pod(node, edited)  # same virtual instant: instance 1 ties instance 0

        await node.advance(120.0)
        main = edited.pod().spec.containers[0]
        live = [c for c in node.fake.cri_containers() if c.uid == uid and c.state.name ==
                "CONTAINER_RUNNING"]
        assert [(c.name, c.spec_hash) for c in live] == [("main", container_hash(main))]
        assert node.agent is not None
        stored = node.agent.store.get(uid)
        assert stored is not None
        main_status = status_of(stored.status.container_statuses, "main")
        assert main_status.state.running is not None, main_status.state
        assert main_status.restart_count == 1


async def test_init_container_restart_count_survives_a_new_sandbox_during_backoff(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The count resumes from the container's log files when a new sandbox purged every
    instance, as Go's calcRestartCountByLogDir (found by hypothesis)."""
    plan = PodPlan("web", "Always", (ContainerPlan("main"),),
                   init=ContainerPlan("init", Behaviour(exit_after=0.5, exit_code=1)))
    async with open_node(autojump_clock) as node:
        await node.start_agent()
        uid = await put_pod(node, plan)
        await node.advance(2.5)  # failed twice: restarted once, now in a 10 s backoff
        init = [c for c in node.fake.cri_containers() if c.name == "init"]
        assert [c.attempt for c in init] == [1]  # older exited instances are pruned
        [sandbox] = node.fake.cri_sandboxes()
        # The sandbox dies while the init container waits out its backoff.
        node.fake.stop_pod_sandbox(v1.StopPodSandboxRequest(pod_sandbox_id=sandbox.id))

        highest = 1
        for _ in range(30):
            await node.advance(1.0)
            assert node.agent is not None
            stored = node.agent.store.get(uid)
            assert stored is not None
            count = status_of(stored.status.init_container_statuses, "init").restart_count
            assert count >= highest, f"init restart count went {highest} -> {count}"
            highest = count
        attempts = [c.attempt for c in node.fake.cri_containers() if c.name == "init"]
        assert attempts and min(attempts) >= 2, attempts



@pytest.mark.xfail(strict=True, reason=(
    "compute_pod_actions never gives a Never pod a new sandbox once any container ran "
    "(Go's rule, and Go's bug: kubernetes/kubernetes#118321, #79398, #77544); a sidecar "
    "that ran is enough, so when the sandbox dies before the regular containers start "
    "the pod stays Pending forever with nothing running and nothing left to do"))
async def test_never_pod_whose_sandbox_dies_before_its_containers_run_does_not_hang(
    autojump_clock: trio.testing.MockClock,
) -> None:
    plan = PodPlan("job", "Never", (ContainerPlan("main"),), sidecar=ContainerPlan("proxy"))
    async with open_node(autojump_clock) as node:
        await node.start_agent()
        uid = await put_pod(node, plan)  # the first sync starts the sidecar only
        assert [c.name for c in node.fake.cri_containers()] == ["proxy"]
        [sandbox] = node.fake.cri_sandboxes()
        node.fake.stop_pod_sandbox(v1.StopPodSandboxRequest(pod_sandbox_id=sandbox.id))

        await node.advance(120.0)
        assert node.agent is not None
        stored = node.agent.store.get(uid)
        assert stored is not None
        main = status_of(stored.status.container_statuses, "main")
        # Either the pod gets a new sandbox and runs main, or it is reported finished.
        assert main.state.running is not None or stored.status.phase == "Failed", (
            stored.status.phase, main.state)


async def test_new_sandbox_runs_the_init_container_before_the_sidecar_and_the_app(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A new sandbox purges every old init instance, sidecars too (found by hypothesis)."""
    plan = PodPlan("web", "Always", (ContainerPlan("app"),),
                   init=ContainerPlan("setup", Behaviour(exit_after=0.5)),
                   sidecar=ContainerPlan("proxy"), sidecar_first=False)
    async with open_node(autojump_clock) as node:
        await node.start_agent()
        await put_pod(node, plan)
        for _ in range(2):  # the second time, setup's restart is in its 10 s backoff
            await node.advance(4.0)
            assert {c.name for c in node.fake.cri_containers()
                    if c.state.name == "CONTAINER_RUNNING"} == {"proxy", "app"}
            newest = max(node.fake.cri_sandboxes(), key=lambda s: s.attempt)
            node.fake.stop_pod_sandbox(v1.StopPodSandboxRequest(pod_sandbox_id=newest.id))

        await node.advance(60.0)
        newest = max(node.fake.cri_sandboxes(), key=lambda s: s.attempt)
        assert newest.attempt == 2
        inside = {c.name: c for c in node.fake.cri_containers() if c.sandbox_id == newest.id}
        assert set(inside) == {"setup", "proxy", "app"}, "setup never ran in the new sandbox"
        assert inside["setup"].exit_code == 0
        assert inside["setup"].created_at < inside["proxy"].created_at < inside["app"].created_at


@pytest.mark.xfail(strict=True, reason=(
    "an agent restarted while a pod's sandbox is being re-created (its init containers and "
    "sidecars already purged) has no previous status for the purged containers: their "
    "restart counts read 0 and the sidecar, with no instance and no last state, counts as "
    "never started, so a Running pod is reported Pending until everything runs again (Go "
    "keeps both through the status it had: the API server's, or the mirror pod's)"))
async def test_agent_restart_during_a_sandbox_re_creation_keeps_phase_and_restart_counts(
    autojump_clock: trio.testing.MockClock,
) -> None:
    plan = PodPlan("web", "Always", (ContainerPlan("app"),),
                   init=ContainerPlan("setup", Behaviour(exit_after=0.5)),
                   sidecar=ContainerPlan("proxy"), sidecar_first=False)
    async with open_node(autojump_clock) as node:
        await node.start_agent()
        uid = await put_pod(node, plan)

        def status() -> dict[str, object]:
            assert node.agent is not None
            stored = node.agent.store.get(uid)
            assert stored is not None
            counts = {c.name: c.restart_count for c in (*stored.status.init_container_statuses,
                                                          *stored.status.container_statuses)}
            return {"phase": stored.status.phase, **counts}

        async def sandbox_dies() -> None:
            newest = max(node.fake.cri_sandboxes(), key=lambda s: s.attempt)
            node.fake.stop_pod_sandbox(v1.StopPodSandboxRequest(pod_sandbox_id=newest.id))

        await node.advance(4.0)
        await sandbox_dies()  # a new sandbox: everything runs again, once restarted
        await node.advance(5.0)
        before = status()
        assert before == {"phase": "Running", "setup": 1, "proxy": 1, "app": 1}

        await sandbox_dies()
        agent = node.agent
        assert agent is not None
        node.crash_agent_at("RunPodSandbox")  # after the old instances were purged

        async def died() -> bool:
            return agent.done.is_set()

        assert await node.wait_until(died, 5.0)
        await node.start_agent()
        await node.publish()
        after = status()
        assert after["phase"] == "Running", after
        assert all(after[name] >= before[name] for name in ("setup", "proxy", "app")), after


@pytest.mark.xfail(strict=True, reason=(
    "a container left CREATED by an agent killed between CreateContainer and StartContainer "
    "is never removed, and a new sandbox's purge of init containers only removes EXITED "
    "instances (Go's purgeInitContainers removes every instance); when an agent restart "
    "then follows the purge, that stale CREATED instance is the newest one the agent finds "
    "and the sidecar restarts with its old, lower restart count"))
async def test_stale_created_sidecar_instance_does_not_roll_back_its_restart_count(
    autojump_clock: trio.testing.MockClock,
) -> None:
    plan = PodPlan("web", "Always", (ContainerPlan("app"),), sidecar=ContainerPlan("proxy"))
    async with open_node(autojump_clock) as node:

        async def restart_the_dead_agent() -> None:
            agent = node.agent
            assert agent is not None

            async def died() -> bool:
                return agent.done.is_set()

            assert await node.wait_until(died, 5.0)
            await node.start_agent()
            await node.publish()

        def proxy_restarts() -> int:
            assert node.agent is not None
            stored = node.agent.store.get(uid)
            assert stored is not None
            return status_of(stored.status.init_container_statuses, "proxy").restart_count

        await node.start_agent()
        node.crash_agent_at("CreateContainer")
        uid = await put_pod(node, plan)  # the agent dies: proxy instance 0 stays CREATED
        await restart_the_dead_agent()
        await node.advance(3.0)  # proxy instance 1 and app run
        await put_pod(node, plan.with_container(ContainerPlan("proxy", version=1)))
        await node.advance(3.0)  # proxy instance 2 runs the edited spec
        assert proxy_restarts() == 2

        newest = max(node.fake.cri_sandboxes(), key=lambda s: s.attempt)
        node.fake.stop_pod_sandbox(v1.StopPodSandboxRequest(pod_sandbox_id=newest.id))
        node.crash_agent_at("RunPodSandbox")  # the purge is done, the new sandbox made
        await restart_the_dead_agent()
        await node.advance(3.0)
        assert proxy_restarts() >= 2
