"""The project's own broker with TLS and SASL listeners, for the security tests.

Certificates are made here with the ``cryptography`` package: a test CA, the broker's certificate
(for ``localhost``, the host its secured listeners advertise), a client certificate for mTLS, and a
second CA nobody trusts. SCRAM users are created by Kafka's own StorageTool when the data directory is
formatted (``--add-scram``), PLAIN users by the listener's JAAS line. Listeners:

========== ================= ================================================ ===================
name       protocol          authentication                                   settings (example)
========== ================= ================================================ ===================
SASL_SSL   SASL_SSL          PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 over TLS     :meth:`kafka`
SSL        SSL               a client certificate signed by the CA (mTLS)     ``mechanism="MTLS"``
SASL_PLAIN SASL_PLAINTEXT    SCRAM-SHA-256 without TLS
========== ================= ================================================ ===================
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from skewwatch.broker import EmbeddedBroker
from skewwatch.config import KafkaSettings
from skewwatch.ports import free_port

USERS = {"worker": "worker-secret", "producer": "producer-secret"}
ADVERTISED_HOST = "localhost"  # the name in the broker's certificate
SCRAM = ("SCRAM-SHA-256", "SCRAM-SHA-512")


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _certificate(subject: str, key: ec.EllipticCurvePrivateKey, issuer: str, issuer_key: ec.EllipticCurvePrivateKey,
                 *, ca: bool = False, dns: tuple[str, ...] = (), ips: tuple[str, ...] = ()) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(_name(issuer))
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=2))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    names: list[x509.GeneralName] = [x509.DNSName(d) for d in dns] + [x509.IPAddress(ipaddress.ip_address(i))
                                                                       for i in ips]
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


@dataclass
class Certificates:
    """PEM files: ``ca`` (trusted), ``other_ca`` (not), the broker's key+chain, a client cert and key."""

    ca: Path
    other_ca: Path
    broker: Path
    client_cert: Path
    client_key: Path
    stranger_cert: Path  # a client certificate from the CA nobody trusts
    stranger_key: Path


def make_certificates(directory: Path) -> Certificates:
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, other_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = _certificate("skewwatch test CA", ca_key, "skewwatch test CA", ca_key, ca=True)
    other = _certificate("untrusted CA", other_key, "untrusted CA", other_key, ca=True)
    broker_key = ec.generate_private_key(ec.SECP256R1())
    broker = _certificate("kafka-broker", broker_key, "skewwatch test CA", ca_key, dns=(ADVERTISED_HOST,))
    client_key = ec.generate_private_key(ec.SECP256R1())
    client = _certificate("worker", client_key, "skewwatch test CA", ca_key)
    stranger_key = ec.generate_private_key(ec.SECP256R1())
    stranger = _certificate("stranger", stranger_key, "untrusted CA", other_key)
    paths = Certificates(ca=directory / "ca.pem", other_ca=directory / "other-ca.pem",
                         broker=directory / "broker.pem", client_cert=directory / "client.pem",
                         client_key=directory / "client-key.pem", stranger_cert=directory / "stranger.pem",
                         stranger_key=directory / "stranger-key.pem")
    paths.ca.write_bytes(_pem(ca))
    paths.other_ca.write_bytes(_pem(other))
    paths.broker.write_bytes(_key_pem(broker_key) + _pem(broker) + _pem(ca))  # Kafka's PEM keystore: key, chain
    paths.client_cert.write_bytes(_pem(client))
    paths.client_key.write_bytes(_key_pem(client_key))
    paths.stranger_cert.write_bytes(_pem(stranger))
    paths.stranger_key.write_bytes(_key_pem(stranger_key))
    return paths


class SecureBroker:
    """An :class:`~skewwatch.broker.EmbeddedBroker` with the listeners above (see the module docstring)."""

    def __init__(self, directory: Path) -> None:
        self.certs = make_certificates(directory / "certs")
        self.ports = {"SASL_SSL": free_port(), "SSL": 0, "SASL_PLAIN": 0}
        self.ports["SSL"] = free_port(avoid=set(self.ports.values()))
        self.ports["SASL_PLAIN"] = free_port(avoid=set(self.ports.values()))
        jaas_plain = ("org.apache.kafka.common.security.plain.PlainLoginModule required "
                      + " ".join(f'user_{user}="{password}"' for user, password in USERS.items()) + ";")
        scram_module = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        properties = {
            # one keystore (the broker's key and chain) and one truststore (the CA: for mTLS clients)
            "ssl.keystore.type": "PEM", "ssl.keystore.location": str(self.certs.broker),
            "ssl.truststore.type": "PEM", "ssl.truststore.location": str(self.certs.ca),
            "listener.name.sasl_ssl.sasl.enabled.mechanisms": "PLAIN," + ",".join(SCRAM),
            "listener.name.sasl_ssl.plain.sasl.jaas.config": jaas_plain,
            **{f"listener.name.sasl_ssl.{m.lower()}.sasl.jaas.config": scram_module for m in SCRAM},
            "listener.name.ssl.ssl.client.auth": "required",
            "listener.name.sasl_plain.sasl.enabled.mechanisms": "SCRAM-SHA-256",
            "listener.name.sasl_plain.scram-sha-256.sasl.jaas.config": scram_module,
        }
        scram_users = [f"{m}=[name={user},password={password}]" for m in SCRAM for user, password in USERS.items()]
        self.broker = EmbeddedBroker(
            directory / "kafka", port=0, heap="384m",
            extra_listeners=[("SASL_SSL", "SASL_SSL", self.ports["SASL_SSL"], ADVERTISED_HOST),
                             ("SSL", "SSL", self.ports["SSL"], ADVERTISED_HOST),
                             ("SASL_PLAIN", "SASL_PLAINTEXT", self.ports["SASL_PLAIN"], ADVERTISED_HOST)],
            extra_properties=properties,
            format_args=[arg for user in scram_users for arg in ("--add-scram", user)])

    def start(self) -> None:
        self.broker.start(timeout=120)

    def stop(self) -> None:
        self.broker.stop()

    def bootstrap(self, listener: str, host: str = ADVERTISED_HOST) -> str:
        return f"{host}:{self.ports[listener]}"

    def kafka(self, mechanism: str, *, user: str = "worker", password_file: Path | None = None,
              cafile: Path | None = None, listener: str | None = None, check_hostname: bool = True) -> KafkaSettings:
        """Client settings for one cell of the matrix: ``mechanism`` PLAIN / SCRAM-SHA-* / MTLS."""
        cafile = cafile or self.certs.ca
        if mechanism == "MTLS":
            return KafkaSettings(bootstrap=self.bootstrap(listener or "SSL"), security_protocol="SSL",
                                 ssl_cafile=str(cafile), ssl_certfile=str(self.certs.client_cert),
                                 ssl_keyfile=str(self.certs.client_key), ssl_check_hostname=check_hostname)
        listener = listener or "SASL_SSL"
        protocol = "SASL_SSL" if listener == "SASL_SSL" else "SASL_PLAINTEXT"
        assert password_file is not None
        return KafkaSettings(bootstrap=self.bootstrap(listener), security_protocol=protocol,
                             sasl_mechanism=mechanism, sasl_username=user, sasl_password_file=str(password_file),
                             ssl_cafile=str(cafile) if protocol == "SASL_SSL" else None,
                             ssl_check_hostname=check_hostname)
