"""The shipped deployment configs parse as their tools read them: deploy/bentocloud.yaml by
BentoML's own schema of a BentoCloud deployment, with the service this project defines; and the
Bento's image settings (bentofile.yaml, requirements-bento.txt) hold what docs/operations.md says."""

from __future__ import annotations

import os
import re
import subprocess
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


# The Bento's image (bentofile.yaml, requirements-bento.txt, deploy/bento/after_install.sh,
# service.py's bento_image): everything runs on the base image's own Python and packages. The
# image itself is built and run in tests/integration/test_container.py.
BENTOFILE = yaml.safe_load((ROOT / "bentofile.yaml").read_text())
# NGC's tritonserver images from 25.01 on: Ubuntu 24.04, whose python3 is 3.12.
NGC_PYTHON = {25: "3.12", 26: "3.12"}
# What NVIDIA's image brings with TensorRT-LLM: never in the Bento's requirements.
IMAGE_STACK = {"tensorrt-llm", "torch", "xgrammar", "apache-tvm-ffi", "triton", "nvidia-pytriton"}


def requirement_names(path: Path) -> dict[str, str]:
    """{normalized name: requirement line} of a requirements file (its own lines, no -r)."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    names = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            names[canonicalize_name(Requirement(line).name)] = line
    return names


def advisory_floors() -> set[str]:
    """requirements.txt's floors above releases with advisories (its last block)."""
    lines = (ROOT / "requirements.txt").read_text().split("# Floors above releases", 1)[1]
    return {line.split(">=")[0].strip().lower() for line in lines.splitlines() if ">=" in line}


def test_the_bento_installs_its_own_requirements_into_the_images_python() -> None:
    from tensorrtllm_backend.serving.deployment import IMAGE_CONSTRAINTS

    assert BENTOFILE["python"]["requirements_txt"] == "./requirements-bento.txt"
    assert BENTOFILE["python"]["lock_packages"] is False  # a lock would pin over the image's
    envs = {env["name"]: env["value"] for env in BENTOFILE["envs"]}
    assert envs == {
        "UV_SYSTEM_PYTHON": "true",  # BentoML's `uv pip install` goes to the image's Python
        "UV_CONSTRAINT": IMAGE_CONSTRAINTS,  # ... with the image's packages as constraints
        "UV_PYTHON_DOWNLOADS": "never",  # a Python missing from the image fails the build
    }
    script = ROOT / BENTOFILE["docker"]["setup_script"]
    assert script.is_file() and os.access(script, os.X_OK)
    assert IMAGE_CONSTRAINTS in (ROOT / "deploy" / "bento" / "after_install.sh").read_text()


def test_the_bentofile_python_is_the_base_images() -> None:
    """BentoML's `uv venv --python X` must find X in the image: NGC's, not the build machine's."""
    image = BENTOFILE["docker"]["base_image"]
    year = int(re.search(r"tritonserver:(\d{2})\.\d{2}-", image).group(1))
    assert BENTOFILE["docker"]["python_version"] == NGC_PYTHON[year]


def test_the_bento_requirements_are_the_services_without_the_images_stack() -> None:
    """requirements-bento.txt names what the service imports (requirements.txt's runtime list),
    none of the image's TensorRT-LLM stack, and no advisory floor: the image keeps its vendor's
    versions, and an exact pin only where the image has no such package."""
    bento = requirement_names(ROOT / "requirements-bento.txt")
    runtime = requirement_names(ROOT / "requirements.txt")
    assert not set(bento) & IMAGE_STACK
    assert set(bento) == set(runtime) - advisory_floors() - IMAGE_STACK
    pinned = {name for name, line in bento.items() if "==" in line}
    assert pinned <= {"bentoml", "jsonschema-rs"}, pinned


def test_the_image_is_frozen_before_the_requirements() -> None:
    """service.py's image: its one command (before BentoML's install) writes the image's
    packages and the constraints."""
    from tensorrtllm_backend.serving.deployment import (
        IMAGE_CONSTRAINTS,
        IMAGE_PACKAGES,
        bento_image,
    )

    image = bento_image()
    (command,) = image.commands
    assert f"> {IMAGE_PACKAGES}" in command and f"> {IMAGE_CONSTRAINTS}" in command
    assert not image.post_commands and not image.python_requirements
    assert image.lock_python_packages is False


def test_the_freeze_keeps_release_numbers_only(tmp_path: Path) -> None:
    """The constraints are PEP 440 pins; a distro's own version strings are left out."""
    from tensorrtllm_backend.serving.deployment import FREEZE_BASE_IMAGE

    pattern = re.search(r"grep -E '([^']+)'", FREEZE_BASE_IMAGE).group(1)
    listing = "torch==2.9.0a0+145a3a7bda.nv25.10\npython-apt==2.7.7ubuntu4\nnumpy==1.26.4\n"
    kept = subprocess.run(
        ["grep", "-E", pattern], input=listing, capture_output=True, text=True, check=True
    ).stdout.split()
    assert kept == ["torch==2.9.0a0+145a3a7bda.nv25.10", "numpy==1.26.4"]


def test_the_constraints_pin_tensorrt_llms_stack_only() -> None:
    """TensorRT-LLM, torch, xgrammar and what they are compiled against are pinned; packages the
    service shares with the image's tools (fsspec, which BentoML needs newer than TensorRT-LLM's
    `datasets` allows) are not."""
    from tensorrtllm_backend.serving.deployment import FREEZE_BASE_IMAGE

    pattern = re.findall(r"grep -iE '([^']+)'", FREEZE_BASE_IMAGE)[0]
    stack = ["tensorrt_llm==1.1.0", "tensorrt==10.13.3.9", "torch==2.9.0a0+145a3a7bda.nv25.10",
             "torchvision==0.24.0a0", "xgrammar==0.1.25", "apache-tvm-ffi==0.1.6",
             "numpy==1.26.4", "triton==3.5.0", "nvidia-cublas-cu12==12.9.1.4",
             "nvidia-ml-py==13.580.82", "cuda-python==13.0.1", "flashinfer-python==0.6.0"]  # fmt: skip
    others = ["fsspec==2024.9.0", "datasets==3.1.0", "bentoml==1.4.39", "pydantic==2.11.7"]
    kept = subprocess.run(
        ["grep", "-iE", pattern], input="\n".join(stack + others) + "\n",
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert kept == stack
