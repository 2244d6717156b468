"""`bentoml build` from the repository root: the Bento names the packed model, carries the service
code and the Triton templates, and its Dockerfile starts from the NVIDIA Triton TensorRT-LLM image
and runs everything on that image's own Python (tests/integration/test_container.py builds and
runs such an image)."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path

import bentoml
import pytest
import yaml

from tests.integration.conftest import bentoml_build

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def built_bento(demo_model: str) -> Iterator[bentoml.Bento]:
    """Build once (the private BENTOML_HOME of tests/conftest.py is inherited); delete afterwards."""
    bento = bentoml.bentos.get(bentoml_build(sys.executable, [], demo_model, 180))
    yield bento
    bentoml.bentos.delete(str(bento.tag))


def test_bento_lists_the_demo_model(built_bento: bentoml.Bento, demo_model: str) -> None:
    services = built_bento.info.services
    assert [service.name for service in services] == ["trtllm"]
    tags = {str(model.tag) for service in services for model in service.models}
    assert demo_model in tags
    assert built_bento.info.entry_service == "trtllm"


def test_bento_resources_follow_the_cpu_engine(built_bento: bentoml.Bento) -> None:
    (service,) = built_bento.info.services
    assert service.config["resources"] == {"cpu": "2"}  # CPU engine: no GPU requested
    assert service.config["workers"] == 1  # one worker owns the one tritonserver


def test_bento_source_has_service_and_templates(built_bento: bentoml.Bento) -> None:
    src = Path(built_bento.path_of("src"))
    assert (src / "service.py").is_file()
    assert (src / "pack_model.py").is_file()
    assert (src / "tensorrtllm_backend" / "triton" / "supervisor.py").is_file()
    assert (src / "tensorrtllm_backend" / "settings.py").is_file()
    templates = src / "tensorrtllm_backend" / "all_models" / "inflight_batcher_llm"
    for model in (
        "ensemble",
        "preprocessing",
        "tensorrt_llm",
        "postprocessing",
        "tensorrt_llm_bls",
    ):
        assert (templates / model / "config.pbtxt").is_file(), model
    for model in ("preprocessing", "tensorrt_llm", "postprocessing", "tensorrt_llm_bls"):
        assert (templates / model / "1" / "model.py").is_file(), model
    assert (templates / "ensemble" / "1").is_dir()  # Triton needs the version folder
    assert (src / "tensorrtllm_backend" / "packing" / "corpus.txt").is_file()
    assert not (src / "tests").exists()
    assert not list(src.rglob("__pycache__"))
    assert not list(src.rglob(".venv"))


def test_dockerfile_starts_from_the_bentofile_image(built_bento: bentoml.Bento) -> None:
    bentofile = yaml.safe_load((ROOT / "bentofile.yaml").read_text())
    image = bentofile["docker"]["base_image"]
    assert re.fullmatch(r"nvcr\.io/nvidia/tritonserver:\d{2}\.\d{2}-trtllm-python-py3", image)
    dockerfile = Path(built_bento.path_of("env/docker/Dockerfile")).read_text()
    froms = re.findall(r"^FROM\s+(\S+)", dockerfile, re.M)
    assert froms and froms[0] == image


def test_bentofile_image_has_a_known_tensorrt_llm_release() -> None:
    """pack_model checks an engine's version against the target image; for the image the Bento
    actually uses the check is silently skipped when the image's release is unknown."""
    from tensorrtllm_backend.common.engine_config import runtime_version_for_image

    image = yaml.safe_load((ROOT / "bentofile.yaml").read_text())["docker"]["base_image"]
    assert runtime_version_for_image(image) is not None, image


def test_dockerfile_uses_the_images_python_and_packages(built_bento: bentoml.Bento) -> None:
    """BentoML's generated Dockerfile, with bentofile.yaml's settings and service.py's image:
    the venv is made from the base image's Python (bentofile's version, never the build
    machine's; never downloaded), the requirements go into the image's own Python under the
    image's packages as constraints, written before them, and the post-install check after."""
    from tensorrtllm_backend.serving.deployment import FREEZE_BASE_IMAGE, IMAGE_CONSTRAINTS

    bentofile = yaml.safe_load((ROOT / "bentofile.yaml").read_text())
    dockerfile = Path(built_bento.path_of("env/docker/Dockerfile")).read_text()
    lines = dockerfile.splitlines()
    envs = set(re.findall(r"^ENV (UV_[A-Z_]+)=\$\1$", dockerfile, re.M))
    assert envs >= {"UV_SYSTEM_PYTHON", "UV_CONSTRAINT", "UV_PYTHON_DOWNLOADS"}
    assert f"ARG UV_CONSTRAINT={IMAGE_CONSTRAINTS}" in lines
    venv = [line for line in lines if " uv venv " in line]
    assert len(venv) == 1
    assert f"--python {bentofile['docker']['python_version']} /app/.venv" in venv[0]

    def where(text: str) -> int:
        (index,) = [i for i, line in enumerate(lines) if text in line]
        return index

    install = where("pip install -r $BENTO_PATH/env/python/requirements.txt")
    after = where("./env/docker/script__")
    assert where(FREEZE_BASE_IMAGE) < where(" uv venv ") < install < after
    assert where("ENV UV_SYSTEM_PYTHON") < install
    assert len([line for line in lines if "apt-get update" in line]) == 1
    script = Path(built_bento.path_of(lines[after].split(" && ")[-1].removeprefix("./")))
    assert script.read_text() == (ROOT / bentofile["docker"]["setup_script"]).read_text()
    requirements = Path(built_bento.path_of("env/python/requirements.txt")).read_text()
    for name in ("torch", "xgrammar", "tensorrt", "apache-tvm-ffi", "nvidia-pytriton"):
        assert not re.search(rf"^{name}\b", requirements, re.M | re.I), name
