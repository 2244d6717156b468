"""The Bento as it is deployed: `bentoml build` for an image like NVIDIA's, `bentoml containerize`
with podman, the container run, and requests answered.

The base image (scripts/container-base-image.sh) looks like NVIDIA's Triton TensorRT-LLM image
where the Bento depends on it: one system Python with its packages in its own site-packages,
tritonserver at /opt/tritonserver/bin with a python backend stub linked to that Python, and
`tensorrt_llm` (a stand-in package), torch and xgrammar installed system-wide, numpy < 2. The
Bento is built from bentofile.yaml with only the base image and its Python changed, as a user
changes them, by a Python of another version than the image's (a venv with requirements-bento.txt
alone): nothing of the build machine's Python may reach the image. Inside the running container,
the service's interpreter and the Triton stubs' import the image's `tensorrt_llm`, torch and
xgrammar; a chat request through the llmapi route and a guided one (`response_format`) answer 200.

Needs root (debootstrap, chroot) and podman + runc + debootstrap, which
scripts/install-containers.sh installs from Debian's packages (scripts/test.sh runs it); skips,
saying why, where they cannot be had. Stage timings are printed (pytest -s): a first run on a
fresh machine builds the base image; later runs reuse .container-cache/ and podman's layers.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import jsonschema
import openai
import pytest
import yaml

from tensorrtllm_backend.triton.command import find_free_port
from tests.integration.conftest import bentoml_build
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".container-cache"
BENTO_IMAGE = "localhost/bentotrtllm-test-bento:latest"
PYENV_VERSIONS = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]


def _why_no_containers() -> str | None:
    """None where this machine can build and run the test's images; else why not."""
    if not sys.platform.startswith("linux"):
        return "containers: Linux only"
    if os.geteuid() != 0:
        return "the NGC-like base image is built with debootstrap and chroot, which need root"
    subprocess.run([str(ROOT / "scripts" / "install-containers.sh")], check=True, timeout=600)
    missing = [tool for tool in ("podman", "runc", "debootstrap") if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} missing and not installable here (needs apt-get)"
    probe = podman("info", "--format", "{{.Host.OCIRuntime.Name}}", check=False, timeout=60)
    if probe.returncode != 0:
        return f"podman cannot run here: {probe.stderr.strip()[-500:]}"
    return None


def podman(
    *args: str, check: bool = True, timeout: float = 120, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CONTAINERS_CONF": str(CACHE / "containers.conf")}
    result = subprocess.run(
        ["podman", *args], env=env, capture_output=True, text=True, timeout=timeout, input=input
    )
    if check:
        assert result.returncode == 0, f"podman {' '.join(args)}:\n{result.stderr[-4000:]}"
    return result


def timed(name: str, start: float) -> None:
    """What a stage took, for the log (pytest -s shows it): first run against a cached one."""
    print(f"test_container: {name} took {time.monotonic() - start:.0f} s", file=sys.stderr)


@pytest.fixture(scope="module")
def base_image() -> str:
    reason = _why_no_containers()
    if reason is not None:
        pytest.skip(f"the container test cannot run here: {reason}")
    start = time.monotonic()
    result = subprocess.run(
        [str(ROOT / "scripts" / "container-base-image.sh")],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    timed("base image", start)
    return result.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def image_python(base_image: str) -> str:
    return podman(
        "run", "--rm", base_image, "python3", "-c",
        "import sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}')",
    ).stdout.strip()  # fmt: skip


def _python_of(version: str) -> str | None:
    for candidate in (
        shutil.which(f"python{version}"),
        *PYENV_VERSIONS.glob(f"{version}.*/bin/python{version}"),
    ):
        if (
            candidate
            and subprocess.run([str(candidate), "-c", ""], capture_output=True).returncode == 0
        ):
            return str(candidate)
    return None


@pytest.fixture(scope="module")
def builder(image_python: str) -> str:
    """The Python that runs `bentoml build`: another version than the image's, in a venv with
    requirements-bento.txt alone (kept in .container-cache/ while that file is unchanged)."""
    version = next(
        (v for v in ("3.12", "3.13", "3.10") if v != image_python and _python_of(v)), None
    )
    if version is None:  # no other Python here: the project's own, whatever its version
        print("test_container: no Python of another version to build with", file=sys.stderr)
        return sys.executable
    venv = CACHE / f"builder-py{version}"
    requirements = ROOT / "requirements-bento.txt"
    wanted = hashlib.sha256(requirements.read_bytes()).hexdigest()
    stamp = venv / ".requirements.sha256"
    if not stamp.is_file() or stamp.read_text() != wanted:
        start = time.monotonic()
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([str(_python_of(version)), "-m", "venv", str(venv)], check=True, timeout=120)
        subprocess.run(
            [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
             "--disable-pip-version-check", "-r", str(requirements)],
            check=True, timeout=900,
        )  # fmt: skip
        stamp.write_text(wanted)
        timed(f"builder venv (Python {version})", start)
    return str(venv / "bin" / "python")


@pytest.fixture(scope="module")
def bento_tag(
    base_image: str,
    image_python: str,
    builder: str,
    llmapi_demo_model: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[str]:
    """`bentoml build` of this repository with bentofile.yaml's base image and its Python set to
    the test's, nothing else changed."""
    bentofile = yaml.safe_load((ROOT / "bentofile.yaml").read_text())
    bentofile["docker"]["base_image"] = base_image
    bentofile["docker"]["python_version"] = image_python
    path = tmp_path_factory.mktemp("container-bento") / "bentofile.yaml"
    path.write_text(yaml.safe_dump(bentofile))
    start = time.monotonic()
    tag = bentoml_build(builder, ["-f", str(path), str(ROOT)], llmapi_demo_model, 300)
    timed("bentoml build", start)
    yield tag
    subprocess.run([builder, "-m", "bentoml", "delete", "-y", tag], timeout=60)


@pytest.fixture(scope="module")
def bento_image(bento_tag: str, builder: str) -> str:
    """`bentoml containerize --backend podman`, as a user builds the Bento's image (host network
    for the builds' registry access; pip's and uv's caches kept in .container-cache/)."""
    (CACHE / "root-cache").mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    env = {**os.environ, "CONTAINERS_CONF": str(CACHE / "containers.conf")}
    result = subprocess.run(
        [
            builder, "-m", "bentoml", "containerize", bento_tag, "--backend", "podman",
            "-t", BENTO_IMAGE, "--opt", "network=host",
            "--opt", f"volume={CACHE / 'root-cache'}:/root/.cache",
        ],
        env=env, capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-6000:]
    assert podman("image", "exists", BENTO_IMAGE, check=False).returncode == 0, (
        result.stdout[-6000:] + result.stderr[-6000:]
    )
    timed("bentoml containerize", start)
    return BENTO_IMAGE


class Container:
    def __init__(self, name: str, url: str) -> None:
        self.name, self.url = name, url

    def logs(self) -> str:
        result = podman("logs", self.name, check=False)
        return (result.stdout + result.stderr)[-6000:]

    def exec(self, *args: str, input: str | None = None) -> str:
        result = podman("exec", "-i", self.name, *args, check=False, input=input, timeout=180)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        return result.stdout


@pytest.fixture(scope="module")
def container(bento_image: str) -> Iterator[Container]:
    """The Bento's image run as its entrypoint runs it: `serve`, on a free loopback port (host
    network: the sandbox here has no container bridge), the llmapi model on its CPU stand-in."""
    port = find_free_port()
    name = f"bentotrtllm-test-{os.getpid()}"
    start = time.monotonic()
    podman(
        "run", "-d", "--name", name, "--network", "host",
        "-e", "TRTLLM_LLMAPI_IMPL=cpu", "-e", "BENTOML_DO_NOT_TRACK=true", "-e", "HF_HUB_OFFLINE=1",
        bento_image, "serve", "--host", "127.0.0.1", "--port", str(port),
    )  # fmt: skip
    running = Container(name, f"http://127.0.0.1:{port}")
    try:

        def ready() -> bool:
            state = podman("inspect", "-f", "{{.State.Running}}", name, check=False).stdout
            assert state.strip() == "true", f"the container stopped:\n{running.logs()}"
            try:
                return httpx.get(f"{running.url}/readyz", timeout=5).status_code == 200
            except httpx.HTTPError:
                return False

        assert wait_for(ready, timeout=420, interval=2), f"not ready:\n{running.logs()}"
        timed("container start to ready", start)
        yield running
    finally:
        podman("rm", "-f", "-t", "5", name, check=False, timeout=120)


# Run inside the container: the interpreters of the service's worker (tritonserver's parent)
# and of the Triton python stubs, found from /proc, each asked what it imports. A stub's Python
# is the `python3` first on the stub's PATH (the service put its own installation's there) with
# the stub's environment, and TRTLLM_BACKEND_PYTHONPATH in front of sys.path, as model.py does.
PROBE = r"""
import json, os, shutil, subprocess

ASK = '''
import importlib.metadata, json, os, sys
sys.path[:0] = [p for p in os.environ.get("TRTLLM_BACKEND_PYTHONPATH", "").split(os.pathsep) if p]
import tensorrt_llm, torch, xgrammar
import tensorrtllm_backend.python_models.llmapi_choice
print(json.dumps({
    "version": "%d.%d" % sys.version_info[:2], "base_prefix": sys.base_prefix,
    "tensorrt_llm": [tensorrt_llm.__version__, tensorrt_llm.__file__],
    "torch": [torch.__version__, torch.__file__],
    "xgrammar": [importlib.metadata.version("xgrammar"), xgrammar.__file__],
    "ours": tensorrtllm_backend.__file__, "path": sys.path,
}))
'''

def processes():
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = [a.decode() for a in f.read().split(b"\0") if a]
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
        yield int(pid), ppid, argv

def environ(pid):
    with open(f"/proc/{pid}/environ", "rb") as f:
        pairs = [e.decode().split("=", 1) for e in f.read().split(b"\0") if b"=" in e]
    return dict(pairs)

def mapped(pid, prefix):
    with open(f"/proc/{pid}/maps") as f:
        return sorted({line.split()[-1] for line in f if "/" in line and os.path.basename(line.split()[-1]).startswith(prefix)})

def ask(pid, python, env):
    out = subprocess.run([python, "-c", ASK], env=env, cwd=os.readlink(f"/proc/{pid}/cwd"),
                         capture_output=True, text=True, timeout=120)
    return json.loads(out.stdout) if out.returncode == 0 else {"error": out.stderr[-3000:]}

found = list(processes())
servers = [(p, pp) for p, pp, argv in found if argv and os.path.basename(argv[0]) == "tritonserver"]
stubs = [p for p, _, argv in found if argv and argv[0].endswith("triton_python_backend_stub")]
report = {"servers": len(servers), "stubs": len(stubs), "service": None, "stub": None}
if servers:
    worker = servers[0][1]
    report["service"] = ask(worker, os.readlink(f"/proc/{worker}/exe"), environ(worker))
    report["service"]["exe"] = os.path.realpath(f"/proc/{worker}/exe")
if stubs:
    env = environ(stubs[0])
    python = shutil.which("python3", path=env.get("PATH"))
    report["stub"] = ask(stubs[0], python, env)
    report["stub"]["python3"] = os.path.realpath(python)
    report["stub"]["libpython"] = mapped(stubs[0], "libpython")
print(json.dumps(report))
"""


def test_the_image_has_one_python(container: Container, image_python: str, builder: str) -> None:
    """The venv BentoML made and activates is the image's python3 with the image's packages;
    no Python of uv's own, none of the build machine's version."""
    builder_version = subprocess.run(
        [builder, "-c", "import sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}')"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    out = container.exec(
        "sh", "-c",
        "test ! -e /app/python && ls /usr/bin/python3.* /usr/local/bin/python3.* 2>/dev/null;"
        " /app/.venv/bin/python -c 'import sys, tensorrt_llm, bentoml;"
        " print(sys.base_prefix, sys.version_info[:2], tensorrt_llm.__version__)'",
    )  # fmt: skip
    major, minor = image_python.split(".")
    assert f"/usr ({major}, {minor}) 0.0.0+standin" in out, out
    if builder_version != image_python:
        assert f"python{builder_version}" not in out, out
    # Every package of the base image (as written down before the install) is at the version it
    # had: here the Bento's requirements added packages and changed none.
    changed = container.exec("/app/.venv/bin/python", "-", input=UNCHANGED)
    assert changed.strip() == "[]", changed


UNCHANGED = """
import importlib.metadata, json
pins = [line.strip().split("==") for line in open("/app/image-packages.txt") if "==" in line]
print(json.dumps([(n, v, importlib.metadata.version(n)) for n, v in pins
                  if importlib.metadata.version(n) != v]))
"""


def test_the_service_and_the_stubs_import_the_images_tensorrt_llm(
    container: Container, image_python: str
) -> None:
    report = json.loads(container.exec("/app/.venv/bin/python", "-", input=PROBE))
    assert report["servers"] == 1 and report["stubs"] >= 1, report
    site = f"/usr/local/lib/python{image_python}/dist-packages/"
    for who in ("service", "stub"):
        seen = report[who]
        assert "error" not in seen, (who, seen)
        assert seen["version"] == image_python and seen["base_prefix"] == "/usr", (who, seen)
        assert seen["tensorrt_llm"] == ["0.0.0+standin", f"{site}tensorrt_llm/__init__.py"]
        assert seen["torch"][1].startswith(site) and seen["xgrammar"][1].startswith(site)
        assert not [p for p in seen["path"] if p.startswith(("/app/python", "/root"))], seen
    assert report["service"]["exe"] == f"/usr/bin/python{image_python}", report["service"]
    # The stub embeds the image's own libpython (NGC's stub links the system's), and its
    # python3 is that installation's.
    assert report["stub"]["libpython"] == [
        f"/usr/lib/x86_64-linux-gnu/libpython{image_python}.so.1.0"
    ], report["stub"]
    assert report["stub"]["python3"] == f"/usr/bin/python{image_python}", report["stub"]


def test_a_chat_request_answers_through_the_llmapi_route(container: Container) -> None:
    client = openai.OpenAI(base_url=f"{container.url}/v1", api_key="unused", max_retries=0)
    model = client.models.list().data[0].id
    answer = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Hello there"}], max_tokens=8
    )
    assert answer.choices[0].message.content, answer
    assert answer.usage is not None and 0 < answer.usage.completion_tokens <= 8


def test_a_guided_request_answers_with_the_images_xgrammar(container: Container) -> None:
    schema = {
        "type": "object",
        "properties": {"color": {"enum": ["red", "green"]}, "ok": {"type": "boolean"}},
        "required": ["color", "ok"],
        "additionalProperties": False,
    }
    response = httpx.post(
        f"{container.url}/v1/chat/completions",
        json={
            "model": httpx.get(f"{container.url}/v1/models", timeout=30).json()["data"][0]["id"],
            "messages": [{"role": "user", "content": "A color, please"}],
            "max_tokens": 48,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "color", "schema": schema, "strict": True},
            },
        },
        timeout=180,
    )
    assert response.status_code == 200, response.text
    content = response.json()["choices"][0]["message"]["content"]
    jsonschema.validate(json.loads(content), schema)
