"""Certificates for the TLS tests, made at test time with `openssl` into a temporary directory.

`make_certificates(dir)` writes a CA, a certificate for 127.0.0.1 (subjectAltName IP:127.0.0.1)
signed by it, used by every server and, as their client certificate, by the test clients, and a
second CA that signed nothing (a client trusting only it must refuse every server). EC P-256 keys:
generated in milliseconds. The certificates carry the extensions Python's strict X.509 checks
ask for (key identifiers, basicConstraints).
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

_LEAF_EXTENSIONS = """\
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth, clientAuth
subjectAltName = IP:127.0.0.1
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid, issuer
"""


@dataclass(frozen=True, slots=True)
class TLSFiles:
    ca: Path
    cert: Path
    key: Path
    #: A CA that signed none of the above.
    wrong_ca: Path

    def server_args(self) -> list[str]:
        """redis-server options: TLS with these files, client certificates required."""
        return [
            "--tls-cert-file",
            str(self.cert),
            "--tls-key-file",
            str(self.key),
            "--tls-ca-cert-file",
            str(self.ca),
            "--tls-auth-clients",
            "yes",
            "--tls-replication",
            "yes",
        ]

    def cli_args(self) -> list[str]:
        """redis-cli options to talk to such a server."""
        return ["--tls", "--cacert", str(self.ca), "--cert", str(self.cert), "--key", str(self.key)]

    def query(self, *, ca: Path | None = None, client_cert: bool = True) -> str:
        """URL query options (redis-py's names) that trust `ca` (default: the right CA) and,
        with `client_cert`, present the client certificate."""
        query = f"ssl_ca_certs={ca or self.ca}&ssl_cert_reqs=required"
        if client_cert:
            query += f"&ssl_certfile={self.cert}&ssl_keyfile={self.key}"
        return query


def openssl_binary() -> str | None:
    return shutil.which("openssl")


def make_certificates(directory: Path) -> TLSFiles:
    """A CA, a 127.0.0.1 certificate it signed, and an unrelated CA, in `directory`."""
    binary = openssl_binary()
    if binary is None:
        raise FileNotFoundError("openssl is not on PATH")
    directory.mkdir(parents=True, exist_ok=True)

    def run(*args: str) -> None:
        done = subprocess.run([binary, *args], capture_output=True, check=False, timeout=30)
        if done.returncode != 0:
            raise RuntimeError(f"openssl {' '.join(args[:2])} failed: {done.stderr[-2000:]!r}")

    key_options = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for name in ("ca", "wrong-ca"):
        run(
            "req", "-x509", *key_options, "-days", "2", "-subj", f"/CN=mcp-once test {name}",
            "-keyout", str(directory / f"{name}.key"), "-out", str(directory / f"{name}.crt"),
        )  # fmt: skip
    (directory / "leaf.ext").write_text(_LEAF_EXTENSIONS)
    run(
        "req", "-new", *key_options, "-subj", "/CN=127.0.0.1",
        "-keyout", str(directory / "node.key"), "-out", str(directory / "node.csr"),
    )  # fmt: skip
    run(
        "x509", "-req", "-in", str(directory / "node.csr"), "-days", "2",
        "-CA", str(directory / "ca.crt"), "-CAkey", str(directory / "ca.key"),
        "-CAcreateserial", "-extfile", str(directory / "leaf.ext"),
        "-out", str(directory / "node.crt"),
    )  # fmt: skip
    return TLSFiles(
        ca=directory / "ca.crt",
        cert=directory / "node.crt",
        key=directory / "node.key",
        wrong_ca=directory / "wrong-ca.crt",
    )
