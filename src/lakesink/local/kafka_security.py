"""TLS material and users for the local Kafka broker's secured listeners (tests, demo).

:class:`BrokerSecurity` makes, with ``openssl``, a private certificate authority, the
broker's certificate (for ``127.0.0.1``), a client certificate for mutual TLS, and a
second, unrelated authority whose trust store does not trust the broker (to test an
untrusted certificate). Keys are in password-protected PKCS#12 stores, trust stores
are PEM files: the forms Kafka's Java client reads (``ssl.keystore.type=PKCS12``,
``ssl.truststore.type=PEM``).

The broker it configures listens three ways: ``PLAINTEXT`` (no authentication; the
principal ``ANONYMOUS`` is a super user, so the tests' own producers and admin calls
work unchanged), ``SASL_SSL`` with SCRAM-SHA-512, and ``SSL`` with client certificates
required (the principal is the certificate's CN). ACLs are on (KRaft's
``StandardAuthorizer``); a resource with no ACL stays open to everyone, so only topics
given ACLs are guarded.
"""

from __future__ import annotations

import secrets
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from lakesink.errors import ServiceError

SCRAM = "SCRAM-SHA-512"


def _openssl(*args: str, cwd: Path) -> None:
    done = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=60)
    if done.returncode != 0:
        raise ServiceError(f"openssl {args[0]} failed: {done.stderr.strip()[-500:]}")


@dataclass
class BrokerSecurity:
    """The files and users of a secured broker, made in ``folder`` by :meth:`create`."""

    folder: Path
    #: SCRAM user -> password, known to the broker from its first start
    users: dict[str, str] = field(default_factory=dict)
    #: the password of every PKCS#12 store made here
    store_password: str = field(default_factory=lambda: secrets.token_hex(12))
    #: the CN of the mutual-TLS client certificate, i.e. its Kafka principal's name
    client_cn: str = "lakesink-client"

    @property
    def ca_pem(self) -> Path:
        return self.folder / "ca.pem"

    @property
    def rogue_ca_pem(self) -> Path:
        """A trust store whose authority did not sign the broker's certificate."""
        return self.folder / "rogue-ca.pem"

    @property
    def broker_p12(self) -> Path:
        return self.folder / "broker.p12"

    @property
    def client_p12(self) -> Path:
        return self.folder / "client.p12"

    def create(self, users: tuple[str, ...] = ("alice", "bob", "carol")) -> BrokerSecurity:
        """Make the authorities, certificates and stores; one random password per user."""
        self.folder.mkdir(parents=True, exist_ok=True)
        d = self.folder
        for ca in ("ca", "rogue-ca"):
            _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "30",
                     "-subj", f"/CN=lakesink test {ca}", "-keyout", f"{ca}.key",
                     "-out", f"{ca}.pem", "-addext", "basicConstraints=critical,CA:TRUE",
                     "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)
        for name, cn, ext in (
            ("broker", "localhost", "subjectAltName=IP:127.0.0.1,DNS:localhost"),
            ("client", self.client_cn, "extendedKeyUsage=clientAuth"),
        ):
            _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={cn}",
                     "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=d)
            (d / f"{name}.ext").write_text(ext + "\n")
            _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                     "-CAcreateserial", "-days", "30", "-extfile", f"{name}.ext",
                     "-out", f"{name}.pem", cwd=d)
            _openssl("pkcs12", "-export", "-in", f"{name}.pem", "-inkey", f"{name}.key",
                     "-certfile", "ca.pem", "-name", name, "-out", f"{name}.p12",
                     "-passout", f"pass:{self.store_password}", cwd=d)
        self.users = {u: secrets.token_hex(12) for u in users}
        return self

    def scram_format_args(self) -> list[str]:
        """``kafka-storage format`` arguments that create the SCRAM users."""
        args: list[str] = []
        for user, password in self.users.items():
            args += ["--add-scram", f"{SCRAM}=[name={user},password={password}]"]
        return args

    def broker_properties(self, *, plain: int, sasl: int, tls: int, controller: int
                          ) -> dict[str, str]:
        """The listener, TLS, SASL and ACL settings of the broker."""
        keystore = {"ssl.keystore.type": "PKCS12", "ssl.keystore.location": str(self.broker_p12),
                    "ssl.keystore.password": self.store_password,
                    "ssl.key.password": self.store_password,
                    "ssl.truststore.type": "PEM", "ssl.truststore.location": str(self.ca_pem)}
        props = {
            "listeners": (f"PLAINTEXT://127.0.0.1:{plain},SASL_SSL://127.0.0.1:{sasl},"
                          f"SSL://127.0.0.1:{tls},CONTROLLER://127.0.0.1:{controller}"),
            "advertised.listeners": (f"PLAINTEXT://127.0.0.1:{plain},"
                                     f"SASL_SSL://127.0.0.1:{sasl},SSL://127.0.0.1:{tls}"),
            "listener.security.protocol.map": ("CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,"
                                               "SASL_SSL:SASL_SSL,SSL:SSL"),
            "inter.broker.listener.name": "PLAINTEXT",
            "sasl.enabled.mechanisms": SCRAM,
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config":
                "org.apache.kafka.common.security.scram.ScramLoginModule required;",
            "listener.name.ssl.ssl.client.auth": "required",
            "ssl.principal.mapping.rules": "RULE:^CN=([^,]+)$/$1/,DEFAULT",
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users": "User:ANONYMOUS",
            "allow.everyone.if.no.acl.found": "true",
        }
        for listener in ("sasl_ssl", "ssl"):
            props.update({f"listener.name.{listener}.{k}": v for k, v in keystore.items()})
        return props
