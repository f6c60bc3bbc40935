"""skewwatch.kafka_security without a broker: which settings combine, where passwords come from, what the
options hold (and never print); the refusals against the real broker are tests/integration/test_kafka_security.py."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from skewwatch.config import ConfigError, KafkaSettings, load_settings
from skewwatch.kafka_security import check_security, client_options, connection_problem


@pytest.mark.parametrize(("settings", "message"), [
    (KafkaSettings(security_protocol="TLS"), "kafka.security_protocol: expected one of"),
    (KafkaSettings(security_protocol="SASL_SSL", sasl_mechanism="GSSAPI", sasl_username="u"), "kafka.sasl_mechanism"),
    (KafkaSettings(security_protocol="SASL_SSL"), "kafka.sasl_username: required"),
    (KafkaSettings(security_protocol="SASL_SSL", sasl_username="u"), "no password"),
    (KafkaSettings(sasl_username="u"), "security_protocol is PLAINTEXT"),
    (KafkaSettings(ssl_cafile="/ca.pem"), "security_protocol is PLAINTEXT"),
    (KafkaSettings(security_protocol="SSL", ssl_cafile="/nowhere/ca.pem"), "kafka.ssl_cafile: /nowhere/ca.pem"),
])
def test_settings_that_cannot_work_are_one_line(settings: KafkaSettings, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        check_security(settings, env={})


def test_the_password_comes_from_a_file_or_the_environment(tmp_path: Path) -> None:
    secret = tmp_path / "password"
    secret.write_text("from-the-file\n")
    kafka = KafkaSettings(security_protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-512", sasl_username="w",
                          sasl_password_file=str(secret))
    options = client_options(kafka, env={"SKEWWATCH_KAFKA_PASSWORD": "from-env"})
    assert options["sasl_plain_password"] == "from-the-file"  # the file wins; its newline is not part of it
    assert "from-the-file" not in repr(options) and "***" in repr(options)
    kafka.sasl_password_file = None
    assert client_options(kafka, env={"SKEWWATCH_KAFKA_PASSWORD": "from-env"})["sasl_plain_password"] == "from-env"


def test_the_settings_load_from_toml_and_environment(tmp_path: Path) -> None:
    config = tmp_path / "skewwatch.toml"
    config.write_text('[kafka]\nsecurity_protocol = "SASL_SSL"\nsasl_mechanism = "SCRAM-SHA-256"\n'
                      'sasl_username = "worker"\n')
    settings = load_settings(config, env={"SKEWWATCH_KAFKA__SSL_CHECK_HOSTNAME": "false"})
    assert (settings.kafka.security_protocol, settings.kafka.sasl_mechanism) == ("SASL_SSL", "SCRAM-SHA-256")
    assert settings.kafka.ssl_check_hostname is False and KafkaSettings().ssl_check_hostname is True


def test_tls_options_verify_the_host_by_default(tmp_path: Path) -> None:
    options = client_options(KafkaSettings(security_protocol="SSL"), env={})
    context = options["ssl_context"]
    assert isinstance(context, ssl.SSLContext) and context.check_hostname and context.verify_mode == ssl.CERT_REQUIRED
    relaxed = client_options(KafkaSettings(security_protocol="SSL", ssl_check_hostname=False), env={})
    assert relaxed["ssl_context"].check_hostname is False


def test_connection_problems_are_classified() -> None:
    kafka = KafkaSettings(security_protocol="SASL_SSL", sasl_mechanism="PLAIN", sasl_username="w")
    refused = connection_problem(ConnectionRefusedError(111, "refused"), "h:1", kafka)
    assert refused.exit_code == 3 and "no Kafka answers at h:1: connection refused" in refused.message
    untrusted = connection_problem(ssl.SSLCertVerificationError(1, "[SSL] certificate verify failed: self-signed "
                                                                   "certificate (_ssl.c:1)"), "h:1", kafka)
    assert untrusted.exit_code == 4 and "h:1 (SASL_SSL, PLAIN as w)" in untrusted.message
