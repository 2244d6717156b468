"""Pairing the Python backend stub's libpython with its standard library (stub_python): which
library the loader picks, whose stdlib goes with it, how the environment is changed, and the
messages when no consistent pair exists. Installations are laid out in tmp_path; the ELF reader
runs on the real stubs of the nvidia-pytriton wheel."""

from __future__ import annotations

import os
import sys
import sysconfig
from pathlib import Path

import pytest

from tensorrtllm_backend.triton.stub_python import (
    ElfLinks,
    Interpreter,
    StubPythonError,
    apply_stub_python,
    installation_of,
    libpython_version,
    plan_stub_python,
    read_elf_links,
)

SONAME = "libpython3.11.so.1.0"
LINKS = ElfLinks(needed=("libcudart.so.12", SONAME, "libc.so.6"), rpath=("$ORIGIN/../libs",))


def no_cache(_soname: str) -> list[Path]:
    return []


def make_installation(prefix: Path, version: str = "3.11", multiarch: str = "") -> Path:
    """<prefix>/lib[/<multiarch>]/libpython<version>.so.1.0, its stdlib, bin/python<version>."""
    libdir = prefix / "lib" / multiarch if multiarch else prefix / "lib"
    libdir.mkdir(parents=True, exist_ok=True)
    library = libdir / f"libpython{version}.so.1.0"
    library.write_bytes(b"\x7fELF")
    stdlib = prefix / "lib" / f"python{version}"
    stdlib.mkdir(parents=True, exist_ok=True)
    (stdlib / "os.py").write_text("")
    (prefix / "bin").mkdir(exist_ok=True)
    binary = prefix / "bin" / f"python{version}"
    binary.write_text("")
    binary.chmod(0o755)
    return library


def interpreter(
    prefix: Path, shared: bool = True, version: tuple[int, int] = (3, 11)
) -> Interpreter:
    return Interpreter(version, prefix, (prefix / "lib",), shared)


@pytest.fixture
def stub(tmp_path: Path) -> Path:
    path = tmp_path / "wheel" / "stubs" / "3.11" / "triton_python_backend_stub"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\x7fELF")
    return path


def test_the_service_interpreters_own_libpython_and_stdlib_are_paired(
    tmp_path: Path, stub: Path
) -> None:
    pyenv = tmp_path / "pyenv" / "3.11.7"
    own = make_installation(pyenv)
    system = make_installation(tmp_path / "usr", multiarch="x86_64-linux-gnu")
    plan = plan_stub_python(
        stub, interpreter(pyenv), [str(system.parent)], cache=lambda _: [system], links=LINKS
    )
    assert plan is not None
    assert plan.library == own.resolve()  # first, ahead of the LD_LIBRARY_PATH it was given
    assert plan.home == pyenv.resolve()
    assert plan.executable == (pyenv / "bin" / "python3.11").resolve()
    assert plan.ours and plan.version == (3, 11)
    assert plan.stdlib == pyenv.resolve() / "lib" / "python3.11"


def test_a_static_interpreter_pairs_with_the_library_the_loader_finds(
    tmp_path: Path, stub: Path
) -> None:
    """Debian's layout: the library under lib/<multiarch>, the stdlib under lib/python3.11."""
    static = tmp_path / "standalone"
    (static / "lib" / "python3.11").mkdir(parents=True)
    system = make_installation(tmp_path / "usr", multiarch="x86_64-linux-gnu")
    plan = plan_stub_python(
        stub, interpreter(static, shared=False), cache=lambda _: [system], links=LINKS
    )
    assert plan is not None
    assert plan.library == system.resolve() and plan.home == (tmp_path / "usr").resolve()
    assert not plan.ours


def test_the_stubs_rpath_wins_over_ld_library_path(tmp_path: Path, stub: Path) -> None:
    """ld.so tries DT_RPATH (of a binary without DT_RUNPATH) before LD_LIBRARY_PATH."""
    bundled = make_installation(tmp_path / "wheel" / "stubs" / "bundled")
    (tmp_path / "wheel" / "stubs" / "libs").symlink_to(bundled.parent)
    pyenv = tmp_path / "pyenv"
    make_installation(pyenv)
    plan = plan_stub_python(stub, interpreter(pyenv), cache=no_cache, links=LINKS)
    assert plan is not None and plan.library == bundled.resolve()
    assert plan.home == (tmp_path / "wheel" / "stubs" / "bundled").resolve()
    runpath = ElfLinks(needed=(SONAME,), rpath=LINKS.rpath, runpath=("/nonexistent",))
    plan = plan_stub_python(stub, interpreter(pyenv), cache=no_cache, links=runpath)
    assert plan is not None and plan.ours  # with DT_RUNPATH, DT_RPATH is ignored


def test_no_shared_libpython_anywhere_fails_naming_what_to_install(
    tmp_path: Path, stub: Path
) -> None:
    static = tmp_path / "standalone"
    static.mkdir()
    with pytest.raises(StubPythonError) as raised:
        plan_stub_python(
            stub, interpreter(static, shared=False), cache=no_cache, links=LINKS, system_dirs=()
        )
    message = str(raised.value)
    assert f"needs {SONAME}" in message and str(stub) in message
    assert "built without a shared libpython" in message
    assert "apt-get install libpython3.11" in message
    assert "--enable-shared" in message and "LD_LIBRARY_PATH" in message


def test_a_libpython_without_its_stdlib_fails_naming_the_library(
    tmp_path: Path, stub: Path
) -> None:
    lonely = tmp_path / "opt" / "lib" / SONAME
    lonely.parent.mkdir(parents=True)
    lonely.write_bytes(b"\x7fELF")
    static = tmp_path / "standalone"
    static.mkdir()
    with pytest.raises(StubPythonError) as raised:
        plan_stub_python(
            stub, interpreter(static, shared=False), [str(lonely.parent)], no_cache, LINKS, ()
        )
    message = str(raised.value)
    assert f"will load {lonely.resolve()}" in message
    assert "lib/python3.11/os.py" in message and "libpython3.11-stdlib" in message


def test_a_stub_of_another_python_pairs_with_its_own_installation(
    tmp_path: Path, stub: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An NGC image's stub for the image's Python, while the service runs another version."""
    system = make_installation(tmp_path / "usr", version="3.12")
    pyenv = tmp_path / "pyenv"
    make_installation(pyenv)
    links = ElfLinks(needed=("libpython3.12.so.1.0",))
    plan = plan_stub_python(stub, interpreter(pyenv), cache=lambda _: [system], links=links)
    assert plan is not None and plan.home == (tmp_path / "usr").resolve()
    assert plan.version == (3, 12) and not plan.ours
    assert "runs Python 3.12" in caplog.text


def test_a_stub_without_a_shared_libpython_is_left_alone(tmp_path: Path, stub: Path) -> None:
    assert plan_stub_python(stub, interpreter(tmp_path), links=ElfLinks(("libc.so.6",))) is None


def test_apply_puts_the_pair_first_on_ld_library_path_and_path(tmp_path: Path, stub: Path) -> None:
    pyenv = tmp_path / "pyenv"
    own = make_installation(pyenv)
    plan = plan_stub_python(stub, interpreter(pyenv), cache=no_cache, links=LINKS)
    assert plan is not None
    env = {"PATH": "/venv/bin:/usr/bin", "LD_LIBRARY_PATH": "/wheel/libs"}
    apply_stub_python(plan, env, tmp_path / "cache")
    first_lib, *rest_lib = env["LD_LIBRARY_PATH"].split(os.pathsep)
    assert rest_lib == ["/wheel/libs"]
    assert os.listdir(first_lib) == [SONAME]  # nothing else shadows other libraries
    assert (Path(first_lib) / SONAME).resolve() == own.resolve()
    first_bin, *rest_bin = env["PATH"].split(os.pathsep)
    assert rest_bin == ["/venv/bin", "/usr/bin"]
    assert os.listdir(first_bin) == ["python3"]
    assert (Path(first_bin) / "python3").resolve() == (pyenv / "bin" / "python3.11").resolve()
    assert "PYTHONHOME" not in env
    again = dict(env)
    apply_stub_python(plan, again, tmp_path / "cache")  # idempotent: no duplicate entries
    assert again == env


def test_apply_uses_pythonhome_without_an_interpreter_binary(tmp_path: Path, stub: Path) -> None:
    pyenv = tmp_path / "pyenv"
    make_installation(pyenv)
    (pyenv / "bin" / "python3.11").unlink()
    plan = plan_stub_python(stub, interpreter(pyenv), cache=no_cache, links=LINKS)
    assert plan is not None and plan.executable is None
    env = {"PATH": "/usr/bin"}
    apply_stub_python(plan, env, tmp_path / "cache")
    assert env["PYTHONHOME"] == str(pyenv.resolve()) and env["PATH"] == "/usr/bin"
    preset = {"PATH": "/usr/bin", "PYTHONHOME": "/chosen"}
    apply_stub_python(plan, preset, tmp_path / "cache")
    assert preset["PYTHONHOME"] == "/chosen"  # whoever set it decided


def test_installation_of_finds_the_prefix_of_debian_and_pyenv_layouts(tmp_path: Path) -> None:
    debian = make_installation(tmp_path / "usr", multiarch="x86_64-linux-gnu")
    pyenv = make_installation(tmp_path / "pyenv")
    assert installation_of(debian, (3, 11)) == (tmp_path / "usr").resolve()
    assert installation_of(pyenv, (3, 11)) == (tmp_path / "pyenv").resolve()
    assert installation_of(pyenv, (3, 12)) is None


def test_libpython_version() -> None:
    assert libpython_version("libpython3.11.so.1.0") == (3, 11)
    assert libpython_version("libpython3.13t.so.1.0") == (3, 13)
    assert libpython_version("libpython3.8.so") == (3, 8)
    assert libpython_version("libpython3-419a3a08.13.so.1.0") == (3, 13)
    assert libpython_version("libc.so.6") is None


def test_a_libpython_bundled_with_the_stub_takes_the_services_stdlib(
    tmp_path: Path, stub: Path
) -> None:
    bundled = tmp_path / "wheel" / "stubs" / "libs" / "libpython3-419a3a08.11.so.1.0"
    bundled.parent.mkdir(parents=True)
    bundled.write_bytes(b"\x7fELF")
    pyenv = tmp_path / "pyenv"
    make_installation(pyenv)
    links = ElfLinks(needed=(bundled.name,), rpath=LINKS.rpath)
    plan = plan_stub_python(stub, interpreter(pyenv), cache=no_cache, links=links)
    assert plan is not None and plan.library == bundled.resolve() and plan.home == pyenv


def test_read_elf_links_of_the_wheels_stubs() -> None:
    pytriton = pytest.importorskip("pytriton")
    stubs = Path(pytriton.__file__).parent / "tritonserver" / "python_backend_stubs"
    versions = sorted(p.parent.name for p in stubs.glob("*/triton_python_backend_stub"))
    assert versions
    for version in versions:
        links = read_elf_links(stubs / version / "triton_python_backend_stub")
        assert links is not None
        major, minor = (int(x) for x in version.split("."))
        # 3.13's is bundled in the wheel, renamed: libpython3-<hash>.13.so.1.0
        assert [n for n in links.needed if libpython_version(n) == (major, minor)], links
        assert "$ORIGIN/../../../../nvidia_pytriton.libs" in links.rpath
    assert read_elf_links(Path(__file__)) is None  # not an ELF file


def test_the_running_interpreter_is_described_from_sysconfig() -> None:
    current = Interpreter.current()
    assert current.version == sys.version_info[:2]
    assert current.base_prefix == Path(sys.base_prefix)
    assert Path(sysconfig.get_config_var("LIBDIR")) in current.library_dirs
