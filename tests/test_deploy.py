"""The deployment files: valid against their schemas, and in step with the code.

Offline and fast: Kubernetes manifests against the schemas that ``kubernetes-validate``
ships (strict), Compose files against the Compose spec bundled in ``check-jsonschema``,
and every ``ACP_BROKER_*`` name, value and command line checked against
:class:`broker.config.Settings` and the CLI's parser.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from broker.cli import build_parser
from broker.config import Settings, load_settings

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
NGINX_CONF = DEPLOY / "nginx.conf"
SCALE_COMPOSE = DEPLOY / "docker-compose.scale.yml"
K8S_VERSION = "1.30"

KUSTOMIZATION = K8S / "kustomization.yaml"
MANIFESTS = sorted(p for p in K8S.glob("*.yaml") if p != KUSTOMIZATION)
COMPOSE_FILES = sorted({*ROOT.glob("docker-compose*.yml"), *DEPLOY.glob("docker-compose*.yml")})
DEPLOY_FILES = sorted(
    {
        *COMPOSE_FILES,
        *MANIFESTS,
        KUSTOMIZATION,
        NGINX_CONF,
        *DEPLOY.glob("Dockerfile*"),
        *DEPLOY.rglob("*.md"),
    }
)

ENV_PREFIX = "ACP_BROKER_"
NOT_FIELDS = {"ACP_BROKER_CONFIG"}  # read by load_settings (the TOML file), not a field
ENV_NAME = re.compile(r"\bACP_BROKER_[A-Z0-9_]*[A-Z0-9]\b")
INTERPOLATION = re.compile(r"^\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::?-(?P<default>[^}]*))?\}$")


@functools.cache
def load_docs(path: Path) -> tuple[dict[str, Any], ...]:
    """The objects in a YAML file (cached: treat them as read-only)."""
    return tuple(doc for doc in yaml.safe_load_all(path.read_text()) if doc)


def k8s_objects() -> list[dict[str, Any]]:
    return [doc for path in MANIFESTS for doc in load_docs(path)]


def k8s_by_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in k8s_objects() if o["kind"] == kind}


def field_for(env_name: str) -> str:
    return env_name.removeprefix(ENV_PREFIX).lower()


def settings_from_env(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> Settings:
    """Settings as a process with exactly ``env`` (of the ACP_BROKER_* variables) reads them."""
    for name in [n for n in os.environ if n.startswith(ENV_PREFIX)]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return load_settings()


# -- Kubernetes ---------------------------------------------------------------------------------


def test_there_are_manifests_and_compose_files() -> None:
    assert len(MANIFESTS) >= 8
    assert not list(K8S.glob("*.yml")), "name manifests *.yaml so that they are checked"
    assert ROOT / "docker-compose.yml" in COMPOSE_FILES
    assert SCALE_COMPOSE in COMPOSE_FILES


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_is_valid_kubernetes(path: Path) -> None:
    docs = load_docs(path)
    assert docs, f"{path.name} holds no object"
    for doc in docs:
        try:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as error:
            where = ".".join(str(part) for part in error.path)
            pytest.fail(f"{path.name}: {doc['kind']} {where}: {error.message}")
        assert doc["metadata"].get("namespace", "acp-broker") == "acp-broker"


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load(KUSTOMIZATION.read_text())
    assert kustomization["kind"] == "Kustomization"
    assert kustomization["namespace"] == "acp-broker"
    assert sorted(kustomization["resources"]) == sorted(p.name for p in MANIFESTS)


def test_k8s_has_every_role_and_object() -> None:
    kinds = {(o["kind"], o["metadata"]["name"]) for o in k8s_objects()}
    for expected in [
        ("Deployment", "acp-broker-front"),
        ("Deployment", "acp-broker-agent-host"),
        ("Deployment", "acp-broker-projector"),
        ("Service", "acp-broker-front"),
        ("PodDisruptionBudget", "acp-broker-front"),
        ("PodDisruptionBudget", "acp-broker-agent-host"),
        ("HorizontalPodAutoscaler", "acp-broker-front"),
        ("ConfigMap", "acp-broker-config"),
        ("Secret", "acp-broker-secrets"),
    ]:
        assert expected in kinds


def test_k8s_commands_are_the_roles_the_cli_has() -> None:
    deployments = k8s_by_kind("Deployment")
    roles = {
        "acp-broker-front": ("serve", None, True),
        "acp-broker-agent-host": ("worker", "agent-host", False),
        "acp-broker-projector": ("worker", "projector", False),
    }
    for name, (command, role, no_workers) in roles.items():
        (container,) = deployments[name]["spec"]["template"]["spec"]["containers"]
        args = build_parser().parse_args(container["args"])
        assert args.command == command
        assert getattr(args, "role", None) == role
        assert getattr(args, "no_workers", False) is no_workers


def test_k8s_pods_share_settings_and_drain() -> None:
    configmaps, secrets = k8s_by_kind("ConfigMap"), k8s_by_kind("Secret")
    for name, deployment in k8s_by_kind("Deployment").items():
        pod = deployment["spec"]["template"]["spec"]
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
        # A Service named acp-broker would inject ACP_BROKER_PORT=tcp://… otherwise.
        assert pod["enableServiceLinks"] is False, name
        assert pod["terminationGracePeriodSeconds"] >= 20, name
        for container in pod["containers"]:
            refs = container["envFrom"]
            assert {r["configMapRef"]["name"] for r in refs if "configMapRef" in r} <= set(
                configmaps
            )
            assert {r["secretRef"]["name"] for r in refs if "secretRef" in r} == {
                "acp-broker-secrets"
            }, f"{name}: every pod needs the same cursor secret and Redis URL"
            assert secrets.keys() >= {"acp-broker-secrets"}
            assert container["resources"]["requests"]["cpu"], name
            assert container["resources"]["requests"]["memory"], name


def test_k8s_front_probes_service_and_budgets_match() -> None:
    config = k8s_by_kind("ConfigMap")["acp-broker-config"]["data"]
    front = k8s_by_kind("Deployment")["acp-broker-front"]
    pod_labels = front["spec"]["template"]["metadata"]["labels"]
    (container,) = front["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {
        "ws": int(config["ACP_BROKER_PORT"]),
        "http": int(config["ACP_BROKER_HTTP_PORT"]),
    }
    # Liveness asks only whether the process serves; readiness whether it can work now.
    for probe, path in (
        ("startupProbe", "/livez"),
        ("readinessProbe", "/readyz"),
        ("livenessProbe", "/livez"),
    ):
        get = container[probe]["httpGet"]
        assert (get["path"], get["port"]) == (path, "http"), probe
    assert "preStop" in container["lifecycle"]
    # The grace period covers the preStop pause and the broker's own drain, with room to spare.
    pause = int(container["lifecycle"]["preStop"]["exec"]["command"][-1])
    drain = float(getattr(Settings(), "drain_timeout", 0.0))
    grace = front["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace >= pause + drain + 10

    service = k8s_by_kind("Service")["acp-broker-front"]
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert {p["targetPort"] for p in service["spec"]["ports"]} == set(ports)

    for name, pdb in k8s_by_kind("PodDisruptionBudget").items():
        selected = pdb["spec"]["selector"]["matchLabels"]
        matching = [
            d
            for d in k8s_by_kind("Deployment").values()
            if selected.items() <= d["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert len(matching) == 1, name

    hpa = k8s_by_kind("HorizontalPodAutoscaler")["acp-broker-front"]
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", "acp-broker-front")
    (metric,) = hpa["spec"]["metrics"]
    assert metric["resource"]["name"] == "cpu"
    assert hpa["spec"]["minReplicas"] >= 2


def test_k8s_settings_load(monkeypatch: pytest.MonkeyPatch) -> None:
    env = dict(k8s_by_kind("ConfigMap")["acp-broker-config"]["data"])
    env |= k8s_by_kind("Secret")["acp-broker-secrets"]["stringData"]
    settings = settings_from_env(monkeypatch, env)
    assert settings.host == "0.0.0.0"
    assert (settings.port, settings.http_listen_port()) == (8765, 8766)
    assert settings.redis_url and settings.cursor_secret
    assert [a.name for a in settings.agent_list()] == ["demo"]


# -- Compose ------------------------------------------------------------------------------------


def check_compose(*paths: Path) -> subprocess.CompletedProcess[str]:
    """``check-jsonschema`` with its bundled Compose spec (no network)."""
    return subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec"]
        + [str(p) for p in paths],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_compose_files_match_the_compose_spec() -> None:
    result = check_compose(*COMPOSE_FILES)
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_spec_check_catches_mistakes(tmp_path: Path) -> None:
    broken = tmp_path / "docker-compose.yml"
    broken.write_text("services:\n  web:\n    image: nginx\n    restart_policy: always\n")
    result = check_compose(broken)
    assert result.returncode == 1, result.stdout + result.stderr


def compose_env(service: dict[str, Any]) -> dict[str, str]:
    """A service's ACP_BROKER_* environment with interpolations at their defaults."""
    raw = service.get("environment") or {}
    if isinstance(raw, list):
        raw = dict(item.partition("=")[::2] if "=" in item else (item, None) for item in raw)
    env = {}
    for name, value in raw.items():
        if not name.startswith(ENV_PREFIX) or value is None:
            continue  # passed through from the shell only when set there
        match = INTERPOLATION.match(str(value))
        if match:
            if match["default"] is None:
                continue
            value = match["default"]
        env[name] = str(value)
    return env


def broker_services(path: Path) -> dict[str, dict[str, Any]]:
    services = yaml.safe_load(path.read_text())["services"]
    return {
        name: service
        for name, service in services.items()
        if "deploy/Dockerfile" in str((service.get("build") or {}).get("dockerfile", ""))
    }


@pytest.mark.parametrize("path", COMPOSE_FILES, ids=lambda p: p.name)
def test_compose_broker_services_start(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    services = broker_services(path)
    assert services
    for name, service in services.items():
        args = build_parser().parse_args(service.get("command") or ["serve", "--host", "0.0.0.0"])
        env = compose_env(service)
        settings = settings_from_env(monkeypatch, env)
        assert settings.redis_url, f"{name}: every container must use the shared Redis"
        assert settings.cursor_secret, f"{name}: nodes must share the cursor secret"
        if args.command == "serve":
            assert settings.host == "0.0.0.0" or args.host == "0.0.0.0", name
    secrets = {compose_env(s)["ACP_BROKER_CURSOR_SECRET"] for s in services.values()}
    urls = {compose_env(s)["ACP_BROKER_REDIS_URL"] for s in services.values()}
    assert len(secrets) == 1 and len(urls) == 1


def test_scaled_compose_roles() -> None:
    compose = yaml.safe_load(SCALE_COMPOSE.read_text())
    services = compose["services"]
    roles = {}
    for name, service in broker_services(SCALE_COMPOSE).items():
        args = build_parser().parse_args(service["command"])
        roles[name] = (args.command, getattr(args, "role", None), getattr(args, "no_workers", None))
    assert sorted(roles.values(), key=str) == sorted(
        [("serve", None, True), ("worker", "agent-host", None), ("worker", "projector", None)],
        key=str,
    )
    assert services["front"]["deploy"]["replicas"] == 2
    redis_command = services["redis"]["command"]
    assert redis_command[redis_command.index("--appendonly") + 1] == "yes"
    lb = services["lb"]
    assert lb["image"].startswith("nginx:")
    assert "./nginx.conf:/etc/nginx/nginx.conf:ro" in lb["volumes"]
    assert (DEPLOY / "nginx.conf").is_file()
    for name in ("agent-host", "projector"):
        port = services[name]["environment"]["ACP_BROKER_METRICS_PORT"]
        check = " ".join(services[name]["healthcheck"]["test"])
        assert f"'127.0.0.1', {port}" in check and "/readyz" in check, name


def test_k8s_workers_are_probed_on_their_metrics_port() -> None:
    for name in ("acp-broker-agent-host", "acp-broker-projector"):
        deployment = k8s_by_kind("Deployment")[name]
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in container.get("env", [])}
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports == {"metrics": int(env["ACP_BROKER_METRICS_PORT"])}, name
        for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/livez")):
            get = container[probe]["httpGet"]
            assert (get["path"], get["port"]) == (path, "metrics"), (name, probe)


# -- nginx --------------------------------------------------------------------------------------


def nginx_block(text: str, opening: str) -> str:
    """The body of the first block that starts with ``opening`` (braces balanced)."""
    start = text.index(opening)
    depth, i = 0, text.index("{", start)
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1 : j]
    raise AssertionError(f"unbalanced block {opening!r}")


def nginx_directives(block: str) -> list[str]:
    lines = (line.split("#", 1)[0].strip() for line in block.splitlines())
    return [" ".join(line.split()) for line in lines if line]


def test_nginx_proxies_websocket_upgrades() -> None:
    text = NGINX_CONF.read_text()
    ws = nginx_directives(nginx_block(text, f"location = {Settings().path} "))
    for directive in [
        "proxy_http_version 1.1;",
        "proxy_set_header Upgrade $http_upgrade;",
        "proxy_set_header Connection $connection_upgrade;",
    ]:
        assert directive in ws
    mapping = nginx_directives(nginx_block(text, "map $http_upgrade $connection_upgrade"))
    assert "default upgrade;" in mapping and "'' close;" in mapping
    timeouts = {
        d.split()[0]: int(d.split()[1].rstrip("s;"))
        for d in ws
        if d.endswith("s;") and "timeout" in d
    }
    assert timeouts["proxy_read_timeout"] >= 3600 and timeouts["proxy_send_timeout"] >= 3600
    assert any(d.startswith("proxy_pass http://$front_ws") for d in ws)
    assert "set $front_ws front:8765;" in nginx_directives(text)
    assert "set $front_http front:8766;" in nginx_directives(text)


# -- drift ----------------------------------------------------------------------------------------


def test_env_names_in_deploy_files_are_settings() -> None:
    fields = set(Settings.model_fields)
    seen: dict[str, set[str]] = {}
    for path in DEPLOY_FILES:
        for name in ENV_NAME.findall(path.read_text()):
            seen.setdefault(name, set()).add(path.name)
    assert {"ACP_BROKER_REDIS_URL", "ACP_BROKER_CURSOR_SECRET"} <= seen.keys()
    unknown = {
        name: sorted(files)
        for name, files in seen.items()
        if name not in NOT_FIELDS and field_for(name) not in fields
    }
    assert not unknown, f"ACP_BROKER_* names that are not Settings fields: {unknown}"


def test_settings_prefix_is_what_deploy_files_use() -> None:
    assert Settings.model_config["env_prefix"] == ENV_PREFIX
