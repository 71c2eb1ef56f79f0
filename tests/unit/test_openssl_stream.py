"""server.openssl_stream: server-side TLS on pyOpenSSL against real clients (stdlib ssl, httpx).

The point of it: a client certificate that does not verify must not fail the handshake.
"""

from __future__ import annotations

import datetime
import os
import ssl
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import trio
import trio.testing
import trustme
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding
from OpenSSL import SSL

from trio_kubelet.server.openssl_stream import OpenSSLStream, server_context


@dataclass
class PKI:
    server_ca: trustme.CA
    client_ca: trustme.CA
    cert_file: Path
    key_file: Path
    client_ca_file: Path


@pytest.fixture
def pki(tmp_path: Path) -> PKI:
    """A server certificate for 127.0.0.1/localhost and a CA for client certificates."""
    server_ca, client_ca = trustme.CA(), trustme.CA(organization_name="clients")
    server = server_ca.issue_cert("127.0.0.1", "localhost")
    cert_file, key_file = tmp_path / "server.crt", tmp_path / "server.key"
    cert_file.write_bytes(b"".join(pem.bytes() for pem in server.cert_chain_pems))
    key_file.write_bytes(server.private_key_pem.bytes())
    client_ca.cert_pem.write_to_path(str(tmp_path / "client-ca.crt"))
    return PKI(server_ca, client_ca, cert_file, key_file, tmp_path / "client-ca.crt")


def server_ctx(pki: PKI, *, client_certs: bool = True) -> SSL.Context:
    return server_context(pki.cert_file, pki.key_file,
                          client_ca_file=pki.client_ca_file if client_certs else None)


def client_ctx(pki: PKI, cert: trustme.LeafCert | None = None,
               alpn: list[str] | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context()
    pki.server_ca.configure_trust(context)
    if cert is not None:
        cert.configure_cert(context)
    context.set_alpn_protocols(alpn or ["h2", "http/1.1"])
    return context


def der(pem: trustme.Blob) -> bytes:
    return x509.load_pem_x509_certificate(pem.bytes()).public_bytes(Encoding.DER)


async def tcp_pair() -> tuple[trio.SocketStream, trio.SocketStream]:
    """(server end, client end) of a real TCP connection on 127.0.0.1."""
    [listener] = await trio.open_tcp_listeners(0, host="127.0.0.1")
    async with listener:
        client = await trio.open_tcp_stream("127.0.0.1", listener.socket.getsockname()[1])
        return await listener.accept(), client


async def connected(server_context: SSL.Context, client_context: ssl.SSLContext
                    ) -> tuple[OpenSSLStream, trio.SSLStream[trio.SocketStream]]:
    """Both ends of a TLS connection whose handshake has completed."""
    server_tcp, client_tcp = await tcp_pair()
    server = OpenSSLStream(server_tcp, server_context)
    client = trio.SSLStream(client_tcp, client_context, server_hostname="127.0.0.1")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.do_handshake)
        nursery.start_soon(client.do_handshake)
    return server, client


async def receive_exactly(stream: trio.abc.ReceiveStream, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = await stream.receive_some()
        assert chunk, f"EOF after {len(data)} of {size} bytes"
        data += chunk
    return bytes(data)


async def test_large_payloads_echo_with_concurrent_send_and_receive(pki: PKI) -> None:
    server, client = await connected(server_ctx(pki), client_ctx(pki))
    payload = os.urandom(6 * 1024 * 1024 + 123)
    echoed = b""

    async def echo() -> None:  # one task receives while another sends, as the server does
        send, receive = trio.open_memory_channel[bytes](1)

        async def pump_in() -> None:
            async with send:
                while data := await server.receive_some(50_000):
                    await send.send(data)

        async def pump_out() -> None:
            async with receive:
                async for data in receive:
                    await server.send_all(data)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(pump_in)
            nursery.start_soon(pump_out)

    async def client_receive() -> None:
        nonlocal echoed
        echoed = await receive_exactly(client, len(payload))
        await client.aclose()  # close_notify: the server's receive_some gives b""

    async with server, trio.open_nursery() as nursery:
        nursery.start_soon(echo)
        nursery.start_soon(client_receive)
        await client.send_all(payload)
    assert echoed == payload


@pytest.mark.parametrize(("offered", "selected"), [(["h2", "http/1.1"], "http/1.1"),
                                                   (["http/1.1"], "http/1.1"),
                                                   (["h2"], None),
                                                   (["spdy/3"], None)])
async def test_alpn_picks_http_1_1_and_never_h2(
        pki: PKI, offered: list[str], selected: str | None) -> None:
    server, client = await connected(server_ctx(pki), client_ctx(pki, alpn=offered))
    async with server, client:
        assert server.selected_alpn_protocol() == selected
        assert client.selected_alpn_protocol() == selected
        assert server.version() == client.version() == "TLSv1.3"


async def test_client_certificate_from_the_trusted_ca_verifies(pki: PKI) -> None:
    intermediate = pki.client_ca.create_child_ca()
    cert = intermediate.issue_cert(common_name="system:node:a")
    server, client = await connected(server_ctx(pki), client_ctx(pki, cert))
    async with server, client:
        await client.send_all(b"ping")
        assert await server.receive_some() == b"ping"
        assert server.verify_error() is None
        assert server.getpeercert(binary_form=True) == der(cert.cert_chain_pems[0])


@pytest.mark.parametrize(("expired", "reason"), [
    (False, "certificate signed by unknown authority"),
    (True, "certificate has expired"),
])
async def test_a_client_certificate_that_does_not_verify_still_completes_the_handshake(
        pki: PKI, expired: bool, reason: str) -> None:
    if expired:
        now = datetime.datetime.now(datetime.UTC)
        cert = pki.client_ca.issue_cert(common_name="late", not_before=now - datetime.timedelta(
            days=2), not_after=now - datetime.timedelta(days=1))
    else:
        cert = trustme.CA(organization_name="mallory").issue_cert(common_name="mallory")
    server, client = await connected(server_ctx(pki), client_ctx(pki, cert))
    async with server, client:
        await client.send_all(b"hello")
        assert await server.receive_some() == b"hello"
        await server.send_all(b"401")
        assert await client.receive_some() == b"401"
        assert server.verify_error() == reason
        assert server.getpeercert(binary_form=True) == der(cert.cert_chain_pems[0])


@pytest.mark.parametrize("client_certs", [True, False])
async def test_no_client_certificate(pki: PKI, client_certs: bool) -> None:
    server, client = await connected(server_ctx(pki, client_certs=client_certs),
                                     client_ctx(pki))
    async with server, client:
        await client.send_all(b"anonymous")
        assert await server.receive_some() == b"anonymous"
        assert server.getpeercert(binary_form=True) is None
        assert server.verify_error() is None


async def test_tls12_with_an_untrusted_client_certificate(pki: PKI) -> None:
    context = client_ctx(pki, trustme.CA().issue_cert(common_name="old"))
    context.maximum_version = ssl.TLSVersion.TLSv1_2
    server, client = await connected(server_ctx(pki), context)
    async with server, client:
        assert server.version() == "TLSv1.2"
        assert server.verify_error() == "certificate signed by unknown authority"
        await client.send_all(b"ping")
        assert await server.receive_some() == b"ping"
        await server.send_all(b"pong")
        assert await client.receive_some() == b"pong"


async def test_receive_some_does_the_handshake_and_keeps_the_bytes_that_follow_it(
        pki: PKI) -> None:
    server_tcp, client_tcp = await tcp_pair()
    server = OpenSSLStream(server_tcp, server_ctx(pki))
    client = trio.SSLStream(client_tcp, client_ctx(pki), server_hostname="127.0.0.1")
    async with server, client, trio.open_nursery() as nursery:
        nursery.start_soon(client.send_all, b"GET / HTTP/1.1\r\n\r\n")  # right after Finished
        nursery.start_soon(server.send_all, b"early")  # waits for the handshake receive_some does
        assert await receive_exactly(server, 18) == b"GET / HTTP/1.1\r\n\r\n"
        assert await receive_exactly(client, 5) == b"early"
        await server.do_handshake()  # again: nothing to do


async def test_tcp_eof_without_close_notify_is_an_eof(pki: PKI) -> None:
    server, client = await connected(server_ctx(pki), client_ctx(pki))
    async with server, client.transport_stream:
        await client.send_all(b"last words")
        # A FIN without close_notify (closing with the session tickets unread would be an RST).
        await client.transport_stream.send_eof()
        assert await receive_exactly(server, 10) == b"last words"
        assert await server.receive_some() == b""
        assert await server.receive_some() == b""


@pytest.mark.parametrize("sent", [b"GET / HTTP/1.1\r\nHost: node\r\n\r\n", b"\x16\x03\x01\x02",
                                  b""])
async def test_a_failed_handshake_is_a_broken_resource(pki: PKI, sent: bytes) -> None:
    server_tcp, client_tcp = await tcp_pair()
    server = OpenSSLStream(server_tcp, server_ctx(pki))
    async with server, client_tcp:
        if sent:
            await client_tcp.send_all(sent)
        await client_tcp.send_eof()  # a plain-HTTP client waits; the others hang up
        with pytest.raises(trio.BrokenResourceError) as caught:
            await server.do_handshake()
        assert isinstance(caught.value.__cause__, SSL.Error)
        with pytest.raises(trio.BrokenResourceError):
            await server.receive_some()


async def test_the_alert_of_a_failed_handshake_reaches_the_client(pki: PKI) -> None:
    context = client_ctx(pki)
    context.maximum_version = ssl.TLSVersion.TLSv1_2
    context.set_ciphers("ECDHE-ECDSA-AES128-SHA")  # CBC: not one the server accepts
    server_tcp, client_tcp = await tcp_pair()
    server = OpenSSLStream(server_tcp, server_ctx(pki))
    client = trio.SSLStream(client_tcp, context, server_hostname="127.0.0.1")
    client_error: list[BaseException | None] = []

    async def client_handshake() -> None:
        with pytest.raises(trio.BrokenResourceError) as caught:
            await client.do_handshake()
        client_error.append(caught.value.__cause__)

    async with server, client, trio.open_nursery() as nursery:
        nursery.start_soon(client_handshake)
        with pytest.raises(trio.BrokenResourceError):
            await server.do_handshake()
    assert "alert handshake failure" in str(client_error[0])


async def test_aclose_sends_close_notify_and_is_idempotent(pki: PKI) -> None:
    server, client = await connected(server_ctx(pki), client_ctx(pki))
    async with client:
        await server.aclose()
        await server.aclose()
        # Not https_compatible: a TCP EOF without close_notify would raise here.
        assert await client.receive_some() == b""
    for call in (server.receive_some(), server.send_all(b"x"), server.do_handshake()):
        with pytest.raises(trio.ClosedResourceError):
            await call


async def test_aclose_does_not_raise_when_the_peer_is_gone(pki: PKI) -> None:
    server, client = await connected(server_ctx(pki), client_ctx(pki))
    await trio.aclose_forcefully(client)
    await server.aclose()


async def test_two_tasks_may_not_receive_or_send_at_once(pki: PKI) -> None:
    server, client = await connected(server_ctx(pki), client_ctx(pki))
    async with server, client, trio.open_nursery() as nursery:
        nursery.start_soon(server.receive_some)
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(trio.BusyResourceError):
            await server.receive_some()
        nursery.start_soon(server.send_all, b"x" * 50_000_000)  # blocks: the client won't read
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(trio.BusyResourceError):
            await server.send_all(b"y")
        nursery.cancel_scope.cancel()


async def test_an_https_client_sees_the_verification_result(pki: PKI) -> None:
    """httpx over the real socket, as the apiserver would connect."""
    [listener] = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listener.socket.getsockname()[1]

    async def serve_one(tcp: trio.SocketStream) -> None:
        async with OpenSSLStream(tcp, server_ctx(pki)) as stream:
            request = b""
            while b"\r\n\r\n" not in request:
                request += await stream.receive_some()
            body = (stream.verify_error() or "verified").encode()
            await stream.send_all(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: "
                                  + str(len(body)).encode() + b"\r\n\r\n" + body)

    mallory = trustme.CA().issue_cert(common_name="mallory")
    alice = pki.client_ca.issue_cert(common_name="alice")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, serve_one, [listener])
        for cert, expected in ((alice, "verified"),
                               (mallory, "certificate signed by unknown authority")):
            async with httpx.AsyncClient(verify=client_ctx(pki, cert)) as http:
                response = await http.get(f"https://127.0.0.1:{port}/pods")
            assert response.text == expected
        nursery.cancel_scope.cancel()


def test_server_context_load_errors_propagate(pki: PKI, tmp_path: Path) -> None:
    with pytest.raises(SSL.Error):  # OpenSSL opens the files itself: no OSError
        server_context(tmp_path / "missing.crt", pki.key_file)
    with pytest.raises(SSL.Error):
        server_context(pki.cert_file, pki.key_file, client_ca_file=tmp_path / "missing.crt")
    other_key = tmp_path / "other.key"
    trustme.CA().issue_cert("x").private_key_pem.write_to_path(str(other_key))
    with pytest.raises(SSL.Error):
        server_context(pki.cert_file, other_key)
