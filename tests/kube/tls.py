"""A throwaway certificate authority and serving certificate for the in-repo API server, made
with ``openssl`` as a cluster's PKI would be: the in-cluster configuration only speaks HTTPS,
verified against the service account's ``ca.crt``."""

from __future__ import annotations

import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Pki:
    ca: Path
    cert: Path
    key: Path

    def server_context(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self.cert, self.key)
        return ctx

    def client_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca))


def _openssl(*args: str) -> None:
    proc = subprocess.run(["openssl", *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"openssl {args[0]} failed: {proc.stderr.strip()}")


def make_pki(directory: Path, *addresses: str) -> Pki:
    """A CA and a certificate for ``addresses`` (IP subjectAltNames) signed by it."""
    directory.mkdir(parents=True, exist_ok=True)
    ca, ca_key = directory / "ca.crt", directory / "ca.key"
    cert, key, csr = directory / "apiserver.crt", directory / "apiserver.key", directory / "a.csr"
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl("req", "-x509", *ec, "-keyout", str(ca_key), "-out", str(ca), "-days", "2",
             "-subj", "/CN=kubernetes")  # fmt: skip
    _openssl("req", *ec, "-keyout", str(key), "-out", str(csr), "-subj", "/CN=kube-apiserver")
    ext = directory / "ext.cnf"
    sans = ",".join(f"IP:{a}" for a in addresses)
    ext.write_text(f"subjectAltName={sans}\nauthorityKeyIdentifier=keyid\n")
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
             "-CAcreateserial", "-out", str(cert), "-days", "2", "-extfile", str(ext))  # fmt: skip
    return Pki(ca=ca, cert=cert, key=key)
