"""Getting a certificate until it works, and renewing it for ever (client-go's certificate
manager loop, shared by the client and the serving certificate).

A failure (the API server unreachable, the request refused, nobody approving it in time) is
logged with what failed and retried after 2 s, doubling to 32 s; the node keeps running on the
certificate it has meanwhile.
"""

from __future__ import annotations

import datetime
import logging
import random
from collections.abc import Awaitable, Callable

import trio

from trio_kubelet.apiserver.client import APIClient
from trio_kubelet.apiserver.errors import APIError
from trio_kubelet.certificate.csr import CertificateRequestError
from trio_kubelet.certificate.keys import (
    KeyPair,
    PEMError,
    PrivateKey,
    load_private_key,
    new_private_key,
)
from trio_kubelet.certificate.store import CertificateStore, StoreError
from trio_kubelet.config import AgentOptions
from trio_kubelet.core.certificates import CertificateTemplate, retry_delay, rotation_deadline

log = logging.getLogger(__name__)

# How long one renewal waits for its CSR to be approved and signed (client-go's
# certificateWaitTimeout) before it counts as failed and is sent again.
RENEWAL_WAIT = 15 * 60.0

WallClock = Callable[[], float]  # epoch seconds


def wall_time(clock: WallClock) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(clock(), datetime.UTC)


class RotatedCertificate:
    """What the client and the serving certificate managers share: the agent's options, the API
    client their CSRs go through, the store of ``pair`` under --cert-dir, and the clock and
    randomness (jitter, retry) rotation runs on."""

    def __init__(
        self,
        options: AgentOptions,
        api: APIClient,
        pair: str,
        *,
        clock: WallClock,
        rng: random.Random | None = None,
    ) -> None:
        self.options = options
        self.api = api
        self.clock = clock
        self.rng = rng or random.Random()
        self.store = CertificateStore(pair, options.certificate_dir)

    def _new_key(self) -> tuple[bytes, PrivateKey, datetime.datetime]:
        """A fresh private key for a renewal (PEM and loaded) and the time it is asked at."""
        key_pem = new_private_key()
        return key_pem, load_private_key(key_pem), wall_time(self.clock)


async def until_obtained(
    obtain: Callable[[], Awaitable[KeyPair]],
    what: str,
    *,
    wait: float = RENEWAL_WAIT,
    rng: random.Random | None = None,
) -> KeyPair:
    """Call ``obtain`` (bounded by ``wait``) until it returns a pair; failures are logged and
    retried with backoff."""
    rng = rng or random.Random()
    failures = 0
    while True:
        try:
            with trio.fail_after(wait):
                return await obtain()
        except trio.TooSlowError:
            problem = f"no certificate was issued within {wait:.0f}s"
        except (CertificateRequestError, StoreError, PEMError, APIError, OSError) as err:
            problem = str(err)
        failures += 1
        delay = retry_delay(failures, rng.random())
        log.error("Cannot get the %s: %s; trying again in %.1fs", what, problem, delay)
        await trio.sleep(delay)


async def rotate_forever(
    current: Callable[[], KeyPair | None],
    template: CertificateTemplate | None,
    renew: Callable[[], Awaitable[KeyPair]],
    what: str,
    *,
    clock: WallClock,
    rng: random.Random | None = None,
) -> None:
    """Renew through ``renew`` at the rotation deadline of ``current()`` (at once when there is
    none or it no longer fits ``template``), for ever."""
    rng = rng or random.Random()
    while True:
        pair = current()
        now = wall_time(clock)
        if pair is not None:
            deadline = rotation_deadline(pair.facts, template, now, rng.random())
            log.info(
                "The %s expires at %s; renewing it at %s",
                what,
                pair.facts.not_after.isoformat(),
                deadline.isoformat(),
            )
            await trio.sleep(max(0.0, (deadline - now).total_seconds()))
        renewed = await until_obtained(renew, what, rng=rng)
        log.info(
            "Renewed the %s (valid %s to %s)",
            what,
            renewed.facts.not_before.isoformat(),
            renewed.facts.not_after.isoformat(),
        )
