"""Server-side TLS for trio on pyOpenSSL, over memory BIOs (with ``clientCAFile`` only).

The Go kubelet asks for a client certificate, always completes the handshake, and
answers 401 when the certificate does not verify. Python's ``ssl`` has no verify
callback, so an untrusted certificate would fail the handshake instead; OpenSSL's
callback lets the handshake go on and keeps the failure for the authenticator.
Without a client CA nothing is asked of the client and ``tls.py`` serves with ``ssl``.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from os import PathLike
from typing import Literal

import trio
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding
from OpenSSL import SSL, crypto

from trio_kubelet.server.tls import ALPN_PROTOCOLS, TLS12_CIPHERS

__all__ = ["OpenSSLStream", "server_context"]

_READ_SIZE = 65536  # one transport read; also what receive_some(None) decrypts at most
_WRITE_CHUNK = 65536  # plaintext encrypted per step of send_all, which bounds buffered ciphertext
_CLOSE_NOTIFY_TIMEOUT = 1.0  # aclose must not hang on a peer that stopped reading

_V = SSL.X509VerificationCodes
_UNKNOWN_AUTHORITY = frozenset({
    _V.ERR_UNABLE_TO_GET_ISSUER_CERT, _V.ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY,
    _V.ERR_UNABLE_TO_VERIFY_LEAF_SIGNATURE, _V.ERR_DEPTH_ZERO_SELF_SIGNED_CERT,
    _V.ERR_SELF_SIGNED_CERT_IN_CHAIN})
_REASONS = {  # worded as Go words the same failures
    _V.ERR_CERT_NOT_YET_VALID: "certificate is not yet valid",
    _V.ERR_CERT_HAS_EXPIRED: "certificate has expired",
    _V.ERR_INVALID_PURPOSE: "certificate specifies an incompatible key usage"}


def _reason(errnum: int) -> str:
    if errnum in _UNKNOWN_AUTHORITY:
        return "certificate signed by unknown authority"
    return _REASONS.get(errnum, f"x509 verify error {errnum}")


class _Peer:
    """A connection's app data, which the verify callback writes to."""

    failure: str | None = None  # why the first failed check failed


def _verify(conn: SSL.Connection, cert: crypto.X509, errnum: int, depth: int, ok: int) -> bool:
    """Keep the first failure and accept anyway: the authenticator answers 401, not TLS."""
    peer = conn.get_app_data()
    if not ok and isinstance(peer, _Peer) and peer.failure is None:
        peer.failure = _reason(errnum)
    return True


_VERSIONS = {
    "VersionTLS10": SSL.TLS1_VERSION,
    "VersionTLS11": SSL.TLS1_1_VERSION,
    "VersionTLS12": SSL.TLS1_2_VERSION,
    "VersionTLS13": SSL.TLS1_3_VERSION,
}


def server_context(cert_file: str | PathLike[str], key_file: str | PathLike[str], *,
                   client_ca_file: str | PathLike[str] | None = None,
                   alpn: Sequence[str] = ALPN_PROTOCOLS, min_version: str = "VersionTLS12",
                   ciphers: str = TLS12_CIPHERS) -> SSL.Context:
    """TLS >= ``min_version`` (Go's name) with the OpenSSL suite list ``ciphers`` below TLS 1.3,
    serving ``cert_file``; with ``client_ca_file``, client certificates are requested (not
    required) and checked against it, failures kept, never fatal.

    Unreadable or mismatched files raise ``OpenSSL.SSL.Error`` or ``OSError``
    (``ValueError`` for a CA file that OpenSSL loads but cryptography cannot parse).
    """
    context = SSL.Context(SSL.TLS_SERVER_METHOD)
    context.set_min_proto_version(_VERSIONS[min_version])
    context.set_options(SSL.OP_NO_COMPRESSION | SSL.OP_NO_RENEGOTIATION)
    context.set_cipher_list(ciphers.encode())
    # Needed for session resumption once client certificates are requested.
    context.set_session_id(b"trio-kubelet")
    context.use_certificate_chain_file(cert_file)
    context.use_privatekey_file(key_file)
    context.check_privatekey()
    ours = [name.encode() for name in alpn]

    def select(conn: SSL.Connection, offered: list[bytes]
               ) -> bytes | SSL._NoOverlappingProtocols:
        return next((name for name in ours if name in offered), SSL.NO_OVERLAPPING_PROTOCOLS)

    context.set_alpn_select_callback(select)
    if client_ca_file is not None:
        context.load_verify_locations(client_ca_file)
        with open(client_ca_file, "rb") as file:
            for ca in x509.load_pem_x509_certificates(file.read()):
                context.add_client_ca(ca)  # tells clients which CA to pick a certificate for
        context.set_verify(SSL.VERIFY_PEER, _verify)
    return context


class _Guard:
    """Raises BusyResourceError when two tasks use one direction at once, as trio does."""

    def __init__(self, what: str) -> None:
        self._what = what
        self._busy = False

    def __enter__(self) -> None:
        if self._busy:
            raise trio.BusyResourceError(f"another task is already {self._what} this stream")
        self._busy = True

    def __exit__(self, *exc_info: object) -> None:
        self._busy = False


class OpenSSLStream(trio.abc.Stream):
    """The server side of a TLS connection over ``transport_stream``; used like
    ``trio.SSLStream(..., server_side=True, https_compatible=True)``.

    Outgoing ciphertext goes through one lock, so a receiving task that must answer
    (handshake, key update) and a sending task never write to the transport together.
    """

    def __init__(self, transport_stream: trio.abc.Stream, context: SSL.Context) -> None:
        self.transport_stream = transport_stream
        self._peer = _Peer()
        self._conn = SSL.Connection(context, None)
        self._conn.set_app_data(self._peer)
        self._conn.set_accept_state()
        self._outgoing: list[bytes] = []  # ciphertext taken from OpenSSL, not yet sent
        self._send_lock = trio.StrictFIFOLock()
        self._handshake_lock = trio.Lock()
        self._receiving = _Guard("receiving from")
        self._sending = _Guard("sending on")
        self._handshook = False
        self._transport_eof = False
        self._eof = False  # receive_some has returned b"": it keeps doing so
        self._broken = False
        self._closed = False

    def _check(self) -> None:
        if self._closed:
            raise trio.ClosedResourceError("the TLS stream is closed")
        if self._broken:
            raise trio.BrokenResourceError("the TLS stream is broken")

    async def _fail(self, exc: Exception) -> trio.BrokenResourceError:
        """Send OpenSSL's alert, if any; mark the stream broken; give the error to raise."""
        try:
            await self._flush(wait=False)  # a task already sending sends the alert too
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            self._broken = True
        return trio.BrokenResourceError(f"TLS error: {exc!r}")

    def _pull(self) -> None:
        """Queue what OpenSSL has written, in order (no await: no other task interleaves)."""
        try:
            while len(chunk := self._conn.bio_read(_READ_SIZE)) == _READ_SIZE:
                self._outgoing.append(chunk)
            self._outgoing.append(chunk)  # shorter: the BIO is empty
        except SSL.WantReadError:
            pass

    async def _flush(self, *, wait: bool = True) -> None:
        """Send the queued ciphertext. ``wait=False``: if another task holds the send lock,
        leave it to that task, which sends all that is queued before it lets go (every
        caller pulls first, so whatever OpenSSL wrote is queued)."""
        self._pull()
        if not self._outgoing or (not wait and self._send_lock.locked()):
            return
        if self._send_lock.locked():
            await self._send_lock.acquire()
        else:
            self._send_lock.acquire_nowait()  # the transport's send is the checkpoint
        try:
            if self._broken:  # the previous holder was cut off in the middle of a record
                raise trio.BrokenResourceError("the TLS stream is broken")
            while self._outgoing:
                data = b"".join(self._outgoing)
                self._outgoing.clear()
                try:
                    await self.transport_stream.send_all(data)
                except BaseException:
                    self._broken = True  # part of a record may be gone: nothing can follow
                    raise
        finally:
            self._send_lock.release()

    async def _fill(self) -> None:
        """Hand OpenSSL the next bytes from the peer (all of them: none are dropped)."""
        if self._transport_eof:
            raise trio.BrokenResourceError("the peer closed the connection")
        try:
            data = await self.transport_stream.receive_some(_READ_SIZE)
        except trio.BrokenResourceError:
            self._broken = True
            raise
        if data:
            self._conn.bio_write(data)
        else:
            self._transport_eof = True
            self._conn.bio_shutdown()

    async def do_handshake(self) -> None:
        """Complete the handshake, once; later calls return at once."""
        await self._handshake(checkpoint=True)

    async def _handshake(self, *, checkpoint: bool) -> None:
        self._check()
        if self._handshook:
            if checkpoint:
                await trio.lowlevel.checkpoint()
            return
        async with self._handshake_lock:
            while not self._handshook:
                self._check()
                try:
                    self._conn.do_handshake()
                except SSL.WantReadError:
                    await self._flush()
                    await self._fill()
                except SSL.Error as exc:
                    raise await self._fail(exc) from exc
                else:
                    self._handshook = True
            await self._flush()  # the last flight (TLS 1.2 Finished, TLS 1.3 tickets)

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        with self._receiving:
            size = _READ_SIZE if max_bytes is None else operator.index(max_bytes)
            if size < 1:
                raise ValueError("max_bytes must be >= 1")
            await self._handshake(checkpoint=False)
            waited = False
            while not self._eof:
                self._check()
                try:
                    data = self._conn.recv(size)
                except SSL.WantReadError:
                    await self._flush(wait=False)
                    await self._fill()
                    waited = True
                    continue
                except SSL.ZeroReturnError:
                    self._eof = True  # close_notify
                except SSL.SysCallError as exc:
                    if not self._transport_eof:
                        raise await self._fail(exc) from exc
                    self._eof = True  # TCP EOF without close_notify: the end, as for HTTPS
                except SSL.Error as exc:
                    raise await self._fail(exc) from exc
                else:
                    # What reading made OpenSSL write (a key update's answer) is queued
                    # and sent by the next flush, which precedes any wait for the peer.
                    if not waited:
                        await trio.lowlevel.checkpoint()
                    return data
            await self._flush(wait=False)
            await trio.lowlevel.checkpoint()
            return b""

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        with self._sending:
            await self._handshake(checkpoint=False)
            view = memoryview(data)
            if not view:
                await trio.lowlevel.checkpoint()
            for start in range(0, len(view), _WRITE_CHUNK):
                chunk = view[start:start + _WRITE_CHUNK]
                while chunk:
                    self._check()
                    try:
                        chunk = chunk[self._conn.send(chunk):]
                    except SSL.Error as exc:
                        raise await self._fail(exc) from exc
                await self._flush()

    async def wait_send_all_might_not_block(self) -> None:
        with self._sending:
            self._check()
            async with self._send_lock:
                await self.transport_stream.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        """Send close_notify if that is quick (never wait for the peer's); close the transport."""
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        self._closed = True
        try:
            if self._handshook and not self._broken and not self._send_lock.locked():
                try:
                    self._conn.shutdown()
                    with trio.move_on_after(_CLOSE_NOTIFY_TIMEOUT):
                        await self._flush()
                except (SSL.Error, trio.BrokenResourceError, trio.ClosedResourceError):
                    pass
        finally:
            await self.transport_stream.aclose()

    def selected_alpn_protocol(self) -> str | None:
        return self._conn.get_alpn_proto_negotiated().decode() or None

    def version(self) -> str | None:
        return self._conn.get_protocol_version_name() if self._handshook else None

    def getpeercert(self, binary_form: Literal[True] = True) -> bytes | None:
        """The DER of the client's certificate (the parsed form is not offered)."""
        if not binary_form:
            raise NotImplementedError("only getpeercert(binary_form=True) is supported")
        cert = self._conn.get_peer_certificate(as_cryptography=True)
        return cert.public_bytes(Encoding.DER) if cert is not None else None

    def verify_error(self) -> str | None:
        """Why the client's certificate did not verify; None if it did or none was sent."""
        return self._peer.failure
