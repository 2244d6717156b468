"""The shipped deployment configs parse as their tools read them: deploy/bentocloud.yaml by
BentoML's own schema of a BentoCloud deployment, with the service this project defines."""

from __future__ import annotations

from pathlib import Path

import yaml
from bentoml._internal.cloud.schemas.schemasv2 import CreateDeploymentSchema
from bentoml._internal.utils.cattr import bentoml_cattr

from tensorrtllm_backend.python_models.stub_settings import kv_events_settings
from tensorrtllm_backend.settings import STUB_VARIABLES

ROOT = Path(__file__).resolve().parents[2]


def test_the_bentocloud_config_is_a_deployment_of_this_service(monkeypatch) -> None:
    config = yaml.safe_load((ROOT / "deploy" / "bentocloud.yaml").read_text())
    deployment = bentoml_cattr.structure(config, CreateDeploymentSchema)
    assert deployment.name == "trtllm" and deployment.bento.startswith("trtllm")
    (service,) = deployment.services
    assert f"class {service}:" in (ROOT / "service.py").read_text()  # the service it defines
    scaling = deployment.services[service].scaling
    assert scaling is not None and 1 <= scaling.min_replicas < scaling.max_replicas
    labels = {label.key: label.value for label in deployment.labels or []}
    assert labels["openai_endpoint"] == "/v1"
    # Its environment is the engine's KV-event settings, and they parse as the engine reads them.
    envs = {env.name: env.value for env in deployment.envs or []}
    assert envs and set(envs) <= set(STUB_VARIABLES)
    for name, value in envs.items():
        monkeypatch.setenv(name, value)
    events = kv_events_settings()
    assert events is not None and events.endpoint == "tcp://0.0.0.0:5557"


def test_the_kubernetes_replicas_publish_what_a_router_reads(monkeypatch) -> None:
    """deploy/kubernetes/replicas.yaml: a Deployment whose pods serve on the port the Service
    names, probe the service's own endpoints, and publish KV-cache events on the port they
    declare, with llm-d's topic; the settings parse as the engine reads them."""
    from tensorrtllm_backend.serving.apis import APIS

    deployment, service = yaml.safe_load_all(
        (ROOT / "deploy" / "kubernetes" / "replicas.yaml").read_text()
    )
    assert (deployment["kind"], service["kind"]) == ("Deployment", "Service")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert service["spec"]["ports"][0]["targetPort"] in ports
    paths = {api.path for api in APIS if api.open}
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert container[probe]["httpGet"]["path"] in paths
    env = {item["name"]: item.get("value") for item in container["env"]}
    for name, value in env.items():
        if name.startswith("TRTLLM_"):
            assert name in STUB_VARIABLES
            monkeypatch.setenv(name, value.replace("$(POD_IP)", "10.0.0.7"))
    events = kv_events_settings()
    assert events is not None and events.endpoint.endswith(f":{ports['kv-events']}")
    assert events.topic == f"kv@10.0.0.7:{ports['http']}@trtllm"
