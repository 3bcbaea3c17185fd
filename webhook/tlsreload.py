"""Hot reload of the serving certificate: new connections get a renewed pair, the listener stays up.

Owns :class:`CertificateSwitch`: it watches ``tls.crt``/``tls.key`` (content digests, as Kopf does:
a mounted Secret's files change without reliable mtimes), builds a fresh server ``SSLContext`` from a
changed pair, and hands it to every new TLS handshake through the live context's ``sni_callback``
(called for every ClientHello, with or without SNI). The listening socket and the connections already
open are never touched, unlike Kopf's own file watch, which closes its listener and every connection
to restart with the new files (admissions in flight or arriving then fail).

A pair that does not load (torn update, key of another certificate, garbage) is logged and skipped:
the previous pair stays in use and the next change is tried again. The files are read through their
resolved paths, so both come from one ``..<timestamp>`` directory of a kubelet-style (or
``webhook.tlsbundle.write_bundle``) atomic update, never one file from each version.

Must not import kopf or the Kubernetes client.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import ssl
from pathlib import Path

logger = logging.getLogger("hami.webhook.tls")


def server_context(certfile: Path, keyfile: Path) -> ssl.SSLContext:
    """A server context for the pair (raises ``OSError``/``ssl.SSLError`` when it does not load)."""
    context = ssl.create_default_context(purpose=ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certfile, keyfile)
    return context


class CertificateSwitch:
    """Serve the newest loadable pair on new connections (see the module docstring)."""

    def __init__(self, certfile: Path, keyfile: Path) -> None:
        self.certfile = certfile
        self.keyfile = keyfile
        self._current: ssl.SSLContext | None = None  # None: the live context's own pair
        self._seen = self._digest()

    def _digest(self) -> str:
        hasher = hashlib.sha256()
        for path in (self.certfile, self.keyfile):
            try:
                hasher.update(path.read_bytes())
            except OSError as exc:
                hasher.update(f"unreadable: {exc.strerror}".encode())
        return hasher.hexdigest()

    def attach(self, live: ssl.SSLContext) -> None:
        """Make ``live`` (the listener's context) hand new handshakes the current pair."""
        live.sni_callback = self._select

    def _select(self, connection: ssl.SSLObject, _server_name: str | None, _live: ssl.SSLContext) -> None:
        if self._current is not None:
            connection.context = self._current

    def check(self) -> bool:
        """Load the pair if the files changed; True when a new pair is now served."""
        digest = self._digest()
        if digest == self._seen:
            return False
        self._seen = digest  # a broken pair is reported once, then waits for the next change
        cert, key = self.certfile.resolve(), self.keyfile.resolve()
        if cert.parent != key.parent:  # mid-swap: the next check sees one version
            self._seen = ""
            return False
        try:
            self._current = server_context(cert, key)
        except (OSError, ssl.SSLError) as exc:
            logger.warning(
                "%s/%s changed but do not load (%s); kept serving the previous certificate",
                self.certfile.name,
                self.keyfile.name,
                exc,
            )
            return False
        logger.info("serving the renewed certificate from %s", self.certfile)
        return True

    async def watch(self, interval: float) -> None:
        """Check every ``interval`` seconds until cancelled."""
        while True:
            await asyncio.sleep(interval)
            await asyncio.to_thread(self.check)
