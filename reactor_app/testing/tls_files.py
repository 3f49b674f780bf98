"""Throw-away TLS files for test servers: a CA and a certificate for 127.0.0.1, made with the
``openssl`` CLI, and the server arguments and client settings that use them."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reactor_app.testing.redis_processes import ServerBinaryMissing


@dataclass(frozen=True)
class TlsFiles:
    """A throw-away CA and a server certificate for 127.0.0.1 (``make_tls_files``)."""

    ca: Path
    cert: Path
    key: Path

    def server_args(self) -> list[str]:
        return [
            "--tls-cert-file",
            str(self.cert),
            "--tls-key-file",
            str(self.key),
            "--tls-ca-cert-file",
            str(self.ca),
            # clients prove nothing but their ACL password; the server proves its identity
            "--tls-auth-clients",
            "no",
        ]

    def client_kwargs(self) -> dict[str, Any]:
        return {"ssl": True, "ssl_ca_certs": str(self.ca)}


def make_tls_files(folder: Path) -> TlsFiles:
    """A CA and a server certificate (SAN ``IP:127.0.0.1``) made with the ``openssl`` CLI."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise ServerBinaryMissing("no openssl binary to make test certificates")
    folder.mkdir(parents=True, exist_ok=True)
    ca, ca_key = folder / "ca.crt", folder / "ca.key"
    cert, key, csr = folder / "server.crt", folder / "server.key", folder / "server.csr"
    extensions = folder / "server.ext"
    extensions.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    commands = [
        ["req", "-x509", "-new", "-nodes", "-newkey", "rsa:2048", "-keyout", str(ca_key),
         "-out", str(ca), "-days", "2", "-subj", "/CN=reactor-test-ca"],
        ["req", "-new", "-nodes", "-newkey", "rsa:2048", "-keyout", str(key), "-out", str(csr),
         "-subj", "/CN=127.0.0.1"],
        ["x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
         "-CAcreateserial", "-out", str(cert), "-days", "2", "-extfile", str(extensions)],
    ]  # fmt: skip
    for arguments in commands:
        subprocess.run([openssl, *arguments], capture_output=True, check=True, timeout=60)
    return TlsFiles(ca=ca, cert=cert, key=key)
