"""Pair the Python backend stub's libpython with the standard library of the same installation.

Triton's python-backend stub links `libpython3.X.so.1.0` and embeds that interpreter. The dynamic
loader picks the library (the stub's RPATH, LD_LIBRARY_PATH, the ld.so cache, /usr/lib...), while
the embedded interpreter finds its standard library from the first `python3` on PATH. Two
installations of one minor version then mix: Debian's 3.11.2 libpython with pyenv's 3.11.7
stdlib fails in `_ssl` (`undefined symbol`), which any model importing transformers needs.

:func:`plan_stub_python` decides, before tritonserver starts, which libpython the stub will load
and which installation owns it; :func:`apply_stub_python` makes both hold whatever PATH the
service was started with: a private directory holding only that libpython goes first on
LD_LIBRARY_PATH, and one holding only that installation's `python3` goes first on PATH (or,
without such a binary, PYTHONHOME names the installation). The PATH form leaves NVIDIA's
`EXECUTION_ENV_PATH` working: its activation script puts the packed environment's own
interpreter in front. Where no consistent pair exists, :class:`StubPythonError` says what was
found and what to install or set, before anything is started.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import struct
import subprocess
import sys
import sysconfig
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

STUB_NAME = "triton_python_backend_stub"
_LIBPYTHON = re.compile(r"^libpython(\d+)\.(\d+)[a-z]*\.so(\.[\d.]+)?$")
# A libpython a wheel bundles, renamed by auditwheel: libpython3-419a3a08.13.so.1.0
_VENDORED_LIBPYTHON = re.compile(r"^libpython(\d+)-[0-9a-f]{8}\.(\d+)[a-z]*\.so(\.[\d.]+)?$")
_DEFAULT_DIRS = ("/lib64", "/usr/lib64", "/lib", "/usr/lib")
# ELF dynamic-section tags (elf.h)
_DT_NEEDED, _DT_STRTAB, _DT_RPATH, _DT_RUNPATH = 1, 5, 15, 29
_PT_LOAD, _PT_DYNAMIC = 1, 2


class StubPythonError(RuntimeError):
    """No libpython and standard library of one installation can be given to the stub."""


@dataclass(frozen=True)
class ElfLinks:
    """What the dynamic loader reads from an executable to find its shared libraries."""

    needed: tuple[str, ...] = ()
    rpath: tuple[str, ...] = ()
    runpath: tuple[str, ...] = ()


def read_elf_links(path: Path) -> ElfLinks | None:
    """DT_NEEDED / DT_RPATH / DT_RUNPATH of a 64-bit little-endian ELF file (x86-64, aarch64:
    every platform Triton ships for); None for anything else."""
    try:
        data = Path(path).read_bytes()
    except OSError:
        return None
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return None
    phoff, _, _, _, phentsize, phnum = struct.unpack_from("<QQIHHH", data, 0x20)
    loads: list[tuple[int, int, int]] = []  # (vaddr, offset, filesz)
    dynamic: tuple[int, int] | None = None
    for index in range(phnum):
        p_type, _, p_offset, p_vaddr, _, p_filesz = struct.unpack_from(
            "<IIQQQQ", data, phoff + index * phentsize
        )
        if p_type == _PT_LOAD:
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == _PT_DYNAMIC:
            dynamic = (p_offset, p_filesz)
    if dynamic is None:
        return ElfLinks()  # statically linked
    entries: list[tuple[int, int]] = []
    for offset in range(dynamic[0], dynamic[0] + dynamic[1], 16):
        tag, value = struct.unpack_from("<qQ", data, offset)
        if tag == 0:
            break
        entries.append((tag, value))
    strtab_vaddr = next((value for tag, value in entries if tag == _DT_STRTAB), None)
    strtab = next(
        (off + strtab_vaddr - va for va, off, size in loads
         if strtab_vaddr is not None and va <= strtab_vaddr < va + size),
        None,
    )  # fmt: skip
    if strtab is None:
        return None

    def text(offset: int) -> str:
        end = data.index(b"\0", strtab + offset)
        return data[strtab + offset : end].decode("utf-8", "replace")

    def paths(tag: int) -> tuple[str, ...]:
        return tuple(p for t, v in entries if t == tag for p in text(v).split(":") if p)

    needed = tuple(text(value) for tag, value in entries if tag == _DT_NEEDED)
    return ElfLinks(needed, paths(_DT_RPATH), paths(_DT_RUNPATH))


def libpython_version(soname: str) -> tuple[int, int] | None:
    match = _LIBPYTHON.match(soname) or _VENDORED_LIBPYTHON.match(soname)
    return (int(match[1]), int(match[2])) if match else None


def _system_dirs() -> list[Path]:
    """ld.so's built-in directories (after LD_LIBRARY_PATH and its cache)."""
    machine = sysconfig.get_config_var("MULTIARCH")
    dirs = [Path(d) / machine for d in _DEFAULT_DIRS] if machine else []
    return [*dirs, *(Path(d) for d in _DEFAULT_DIRS)]


@dataclass(frozen=True)
class Interpreter:
    """The Python running the service, as far as pairing goes: its base installation."""

    version: tuple[int, int]
    base_prefix: Path
    library_dirs: tuple[Path, ...]  # where its own libpython would be (sysconfig LIBDIR...)
    shared: bool  # built with --enable-shared

    @classmethod
    def current(cls) -> Interpreter:
        libdir = sysconfig.get_config_var("LIBDIR")
        multiarch = sysconfig.get_config_var("MULTIARCH")
        base = Path(sys.base_prefix)
        dirs = [Path(libdir)] if libdir else []
        if libdir and multiarch:
            dirs.append(Path(libdir) / multiarch)
        dirs.append(base / "lib")
        return cls(
            version=(sys.version_info.major, sys.version_info.minor),
            base_prefix=base,
            library_dirs=tuple(dict.fromkeys(dirs)),
            shared=bool(sysconfig.get_config_var("Py_ENABLE_SHARED")),
        )

    @property
    def label(self) -> str:
        return f"Python {self.version[0]}.{self.version[1]} at {self.base_prefix}"


@dataclass(frozen=True)
class StubPython:
    """The libpython the stub will load and the installation whose stdlib goes with it."""

    soname: str
    library: Path  # resolved file
    home: Path  # its installation prefix (<home>/lib/python3.X/os.py)
    executable: Path | None  # <home>/bin/python3.X, if installed
    version: tuple[int, int]
    ours: bool  # the service interpreter's own installation

    @property
    def stdlib(self) -> Path:
        return self.home / "lib" / f"python{self.version[0]}.{self.version[1]}"


def ldconfig_cache(soname: str) -> list[Path]:
    """Where the ld.so cache (`ldconfig -p`) has `soname`; empty where ldconfig is missing."""
    ldconfig = shutil.which("ldconfig") or next(
        (p for p in ("/sbin/ldconfig", "/usr/sbin/ldconfig") if os.access(p, os.X_OK)), None
    )
    if ldconfig is None:
        return []
    try:
        listing = subprocess.run(
            [ldconfig, "-p"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    found = []
    for line in listing.splitlines():
        name, _, target = line.strip().partition(" => ")
        if name.split(" ", 1)[0] == soname and target:
            found.append(Path(target.strip()))
    return found


def _expand_origin(entries: Sequence[str], origin: Path) -> list[Path]:
    return [
        Path(e.replace("$ORIGIN", str(origin)).replace("${ORIGIN}", str(origin))) for e in entries
    ]


def loader_search_path(
    stub: Path,
    links: ElfLinks,
    ld_library_path: Sequence[str],
    cache: Callable[[str], list[Path]],
    soname: str,
    system_dirs: Sequence[Path],
) -> list[Path]:
    """The candidate files for `soname`, in the order ld.so tries them for this stub."""
    origin = stub.resolve().parent
    dirs = [] if links.runpath else _expand_origin(links.rpath, origin)  # RPATH only w/o RUNPATH
    dirs += [Path(p) for p in ld_library_path if p]
    dirs += _expand_origin(links.runpath, origin)
    candidates = [d / soname for d in dirs]
    candidates += cache(soname)
    candidates += [d / soname for d in system_dirs]
    return candidates


def installation_of(library: Path, version: tuple[int, int]) -> Path | None:
    """The prefix whose lib/python3.X holds the standard library next to `library`, searching
    the library's parents (pyenv, conda: <prefix>/lib; Debian: <prefix>/lib/<multiarch>)."""
    stdlib = f"python{version[0]}.{version[1]}"
    for parent in list(library.resolve().parents)[:4]:
        for lib in ("lib", "lib64"):
            if (parent / lib / stdlib / "os.py").is_file():
                return parent
    return None


def _executable(home: Path, version: tuple[int, int]) -> Path | None:
    binary = home / "bin" / f"python{version[0]}.{version[1]}"
    return binary.resolve() if os.access(binary, os.X_OK) else None


def _own_library(interpreter: Interpreter, soname: str) -> Path | None:
    for directory in interpreter.library_dirs:
        candidate = directory / soname
        if candidate.is_file():
            return candidate
    return None


def _no_library_message(soname: str, stub: Path, interpreter: Interpreter) -> str:
    major, minor = libpython_version(soname) or interpreter.version
    if (major, minor) != interpreter.version:
        own = f"the stub is built for Python {major}.{minor}, the service runs {interpreter.label}"
    elif not interpreter.shared:
        own = f"{interpreter.label} is built without a shared libpython (static)"
    else:
        dirs = ", ".join(map(str, interpreter.library_dirs))
        own = f"{interpreter.label} has no {soname} in {dirs}"
    return (
        f"the Python backend stub {stub} needs {soname}, and none was found: {own}, and the "
        f"dynamic loader finds no other (LD_LIBRARY_PATH, ld.so cache, /usr/lib). Install one "
        f"(Debian/Ubuntu: `apt-get install libpython{major}.{minor}`), run the service with a "
        f"Python built with --enable-shared (pyenv: `PYTHON_CONFIGURE_OPTS=--enable-shared pyenv "
        f"install {major}.{minor}`), or put the directory holding {soname} on LD_LIBRARY_PATH."
    )


def plan_stub_python(
    stub: Path,
    interpreter: Interpreter,
    ld_library_path: Sequence[str] = (),
    cache: Callable[[str], list[Path]] = ldconfig_cache,
    links: ElfLinks | None = None,
    system_dirs: Sequence[Path] | None = None,
) -> StubPython | None:
    """Which libpython the stub will load and whose stdlib goes with it (None: the stub is not
    a dynamically linked ELF we can read, so nothing is changed). Raises StubPythonError."""
    links = links if links is not None else read_elf_links(stub)
    if links is None:
        logger.warning("cannot read %s: its libpython and standard library are not paired", stub)
        return None
    soname = next((n for n in links.needed if libpython_version(n)), None)
    version = libpython_version(soname) if soname else None
    if soname is None or version is None:
        return None  # libpython linked statically: it finds its stdlib as its build says
    own = _own_library(interpreter, soname) if version == interpreter.version else None
    search = [str(own.parent)] if own else []
    system = _system_dirs() if system_dirs is None else system_dirs
    candidates = loader_search_path(stub, links, [*search, *ld_library_path], cache, soname, system)
    library = next((c for c in candidates if c.is_file()), None)
    if library is None:
        raise StubPythonError(_no_library_message(soname, stub, interpreter))
    home = installation_of(library, version)
    if home is None and version == interpreter.version and not _LIBPYTHON.match(soname):
        # Bundled with the stub (nvidia-pytriton's 3.13): meant for the running Python's stdlib.
        home = interpreter.base_prefix
    if home is None:
        stdlib = f"lib/python{version[0]}.{version[1]}"
        raise StubPythonError(
            f"the Python backend stub {stub} will load {library.resolve()}, but no standard "
            f"library ({stdlib}/os.py) was found in the installation it belongs to. Install that "
            f"Python's standard library (Debian/Ubuntu: `apt-get install "
            f"libpython{version[0]}.{version[1]}-stdlib`), or put the lib directory of a "
            f"complete Python {version[0]}.{version[1]} installation on LD_LIBRARY_PATH."
        )
    if version != interpreter.version:
        logger.warning(
            "the Python backend stub %s runs Python %d.%d, the service %s: python models run "
            "on the interpreter, standard library and packages of %s (the service's packages, "
            "for Python %d.%d, are left off their path: install what they import there)",
            stub, *version, interpreter.label, home, *interpreter.version,
        )  # fmt: skip
    ours = own is not None and library.resolve() == own.resolve()
    return StubPython(soname, library.resolve(), home, _executable(home, version), version, ours)


def apply_stub_python(plan: StubPython, env: dict[str, str], cache_root: Path) -> None:
    """Point the stub at `plan` in tritonserver's environment `env` (which the stubs inherit)."""
    key = hashlib.sha256(f"{plan.library}\0{plan.executable}".encode()).hexdigest()[:12]
    root = cache_root / f"stub-python-{key}"
    library_dir = root / "lib"
    _link(library_dir / plan.soname, plan.library)
    env["LD_LIBRARY_PATH"] = _prepend(str(library_dir), env.get("LD_LIBRARY_PATH", ""))
    if "PYTHONHOME" in env:  # set by whoever started the service: its choice stands
        return
    if plan.executable is not None:
        bin_dir = root / "bin"
        _link(bin_dir / "python3", plan.executable)
        env["PATH"] = _prepend(str(bin_dir), env.get("PATH", ""))
    else:
        env["PYTHONHOME"] = str(plan.home)


def describe(plan: StubPython) -> str:
    return f"libpython {plan.library} with the standard library of {plan.home}"


def _prepend(entry: str, value: str) -> str:
    rest = [p for p in value.split(os.pathsep) if p and p != entry]
    return os.pathsep.join([entry, *rest])


def _link(link: Path, target: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() and Path(os.readlink(link)) == target:
        return
    partial = link.with_name(f".{link.name}.{os.getpid()}")
    partial.unlink(missing_ok=True)
    partial.symlink_to(target)
    partial.replace(link)  # atomic: workers sharing the cache never see a missing link
