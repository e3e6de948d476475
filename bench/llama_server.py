"""Build (once) and locate llama.cpp's C++ ``llama-server`` for the benchmarks.

The llama.cpp sources come from the llama-cpp-python sdist (the same version
corral runs), so both sides use the very same llama.cpp. Everything lives
outside the repository, under ``~/.cache/corral-bench/`` (override with
``CORRAL_BENCH_CACHE``); the finished binary is reused by later runs.

Usage::

    .venv/bin/python -m bench.llama_server            # build if missing, print the path
    .venv/bin/python -m bench.llama_server --rebuild  # force a fresh build

On a GPU build (``make install BACKEND=vulkan``, then ``. .venv/llama-cpp-vulkan/env.sh``:
``LLAMA_CPP_LIB_PATH`` names its libraries) the same command gives a llama-server on shared
libraries that runs on those very libraries (``LD_LIBRARY_PATH``): the ggml and the GPU backend
corral's workers load there. Only llama.cpp's CPU code compiles for it (no shaders, no CUDA:
the backend comes from the wheel), once, beside the static build.

The build never reaches the network: the web UI is not downloaded
(LLAMA_USE_PREBUILT_UI=OFF), OpenSSL/FetchContent are disabled.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
CACHE = Path(os.environ.get("CORRAL_BENCH_CACHE", Path.home() / ".cache" / "corral-bench"))
SRC_ROOT = CACHE / f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}"
LLAMA_CPP = SRC_ROOT / "vendor" / "llama.cpp"
BUILD_DIR = CACHE / "build-llama-server"
BINARY = CACHE / "bin" / "llama-server"
# on shared libraries, run on a GPU build's (LLAMA_CPP_LIB_PATH) through ON_LIBS
SHARED_BUILD_DIR = CACHE / "build-llama-server-shared"
SHARED_BINARY = SHARED_BUILD_DIR / "bin" / "llama-server"
ON_LIBS = CACHE / "bin" / "llama-server-on-libs"
LIB_PATH_ENV = "LLAMA_CPP_LIB_PATH"  # llama-cpp-python's: the directory libllama (and ggml) load from

CMAKE_FLAGS = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DGGML_NATIVE=ON",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DFETCHCONTENT_FULLY_DISCONNECTED=ON",
]


def _log(msg: str) -> None:
    print(f"[llama_server] {msg}", file=sys.stderr, flush=True)


def _python() -> str:
    return sys.executable


def fetch_sources() -> Path:
    """Download the llama-cpp-python sdist via pip and unpack it into the cache."""
    if (LLAMA_CPP / "CMakeLists.txt").exists():
        return LLAMA_CPP
    sdist_dir = CACHE / "sdist"
    sdist_dir.mkdir(parents=True, exist_ok=True)
    tarballs = sorted(sdist_dir.glob(f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}.tar.gz"))
    if not tarballs:
        _log(f"downloading llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION} sdist")
        subprocess.run(
            [_python(), "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
             f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}", "-d", str(sdist_dir)],
            check=True,
        )
        tarballs = sorted(sdist_dir.glob(f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}.tar.gz"))
    if not tarballs:
        raise RuntimeError(f"sdist not found in {sdist_dir}")
    _log(f"extracting {tarballs[0].name}")
    with tarfile.open(tarballs[0]) as tf:
        try:
            tf.extractall(CACHE, filter="data")
        except TypeError:  # Python < 3.12
            tf.extractall(CACHE)
    if not (LLAMA_CPP / "CMakeLists.txt").exists():
        raise RuntimeError(f"llama.cpp sources missing at {LLAMA_CPP}")
    return LLAMA_CPP


def gpu_libs() -> Path | None:
    """The GPU build's library directory the benchmark runs on (``LLAMA_CPP_LIB_PATH``), or None."""
    env = os.environ.get(LIB_PATH_ENV)
    return Path(env) if env else None


def build(jobs: int = 2, rebuild: bool = False) -> Path:
    """Return the path of a built llama-server, building it if needed: on a GPU build's
    libraries (``gpu_libs``) the shared one through its launcher, else the static one."""
    if gpu_libs() is not None:
        return build_on_libs(jobs, rebuild)
    if BINARY.exists() and not rebuild:
        return BINARY
    if shutil.which("cmake") is None:
        raise RuntimeError("cmake not found: install cmake (apt-get install cmake) to build llama-server")
    src = fetch_sources()
    if rebuild and BUILD_DIR.exists():
        shutil.rmtree(BUILD_DIR)
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    _log(f"configuring {src} -> {BUILD_DIR}")
    subprocess.run(["cmake", "-S", str(src), "-B", str(BUILD_DIR), *CMAKE_FLAGS], check=True)
    _log(f"building llama-server with -j{jobs} (several minutes on 2 cores)")
    subprocess.run(
        ["cmake", "--build", str(BUILD_DIR), "--config", "Release", "--target", "llama-server", f"-j{jobs}"],
        check=True,
    )
    built = BUILD_DIR / "bin" / "llama-server"
    if not built.exists():
        raise RuntimeError(f"build finished but {built} is missing")
    BINARY.parent.mkdir(parents=True, exist_ok=True)
    tmp = BINARY.with_suffix(".tmp")
    shutil.copy2(built, tmp)
    os.replace(tmp, BINARY)
    _log(f"built {BINARY}")
    return BINARY


def build_on_libs(jobs: int = 2, rebuild: bool = False) -> Path:
    """llama-server on shared libraries (``BUILD_SHARED_LIBS``, the CPU backend only) and
    ``ON_LIBS``, a launcher that runs it on ``$LLAMA_CPP_LIB_PATH``'s libraries: the same
    sonames (libllama.so.0, libggml.so.0, libggml-base.so.0, libmtmd.so.0) from the same
    sources, found first through ``LD_LIBRARY_PATH`` (the binary's RUNPATH, its own build
    directory, comes after it: llama-common stays the build's own)."""
    if not (SHARED_BINARY.exists() and ON_LIBS.exists()) or rebuild:
        if shutil.which("cmake") is None:
            raise RuntimeError("cmake not found: install cmake (apt-get install cmake) to build llama-server")
        src = fetch_sources()
        if rebuild and SHARED_BUILD_DIR.exists():
            shutil.rmtree(SHARED_BUILD_DIR)
        flags = [f for f in CMAKE_FLAGS if not f.startswith("-DBUILD_SHARED_LIBS=")] + ["-DBUILD_SHARED_LIBS=ON"]
        _log(f"configuring {src} -> {SHARED_BUILD_DIR} (shared libraries)")
        subprocess.run(["cmake", "-S", str(src), "-B", str(SHARED_BUILD_DIR), *flags], check=True)
        _log(f"building llama-server on shared libraries with -j{jobs}")
        subprocess.run(["cmake", "--build", str(SHARED_BUILD_DIR), "--config", "Release", "--target",
                        "llama-server", f"-j{jobs}"], check=True)
        if not SHARED_BINARY.exists():
            raise RuntimeError(f"build finished but {SHARED_BINARY} is missing")
        ON_LIBS.parent.mkdir(parents=True, exist_ok=True)
        tmp = ON_LIBS.with_suffix(".tmp")
        tmp.write_text(
            "#!/bin/sh\n# llama-server on the libraries in $LLAMA_CPP_LIB_PATH (bench/llama_server.py)\n"
            'export LD_LIBRARY_PATH="${LLAMA_CPP_LIB_PATH:?a GPU build\'s libraries}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"\n'
            f'exec "{SHARED_BINARY}" "$@"\n'
        )
        tmp.chmod(0o755)
        os.replace(tmp, ON_LIBS)
        _log(f"built {SHARED_BINARY}; {ON_LIBS} runs it on $LLAMA_CPP_LIB_PATH")
    return ON_LIBS


def buffer_args() -> list[str]:
    """llama-server's flags for the weight buffers corral's workers load with: ``--no-repack``
    where ggml's AMX buffer would take the weights (``corral.worker.host.devices.ggml_amx``: its
    matrix product crashes there), none elsewhere. Both builds are native to this machine."""
    from corral.worker.host.devices import ggml_amx

    return ["--no-repack"] if ggml_amx() else []


def find() -> Path | None:
    """$LLAMA_SERVER, or the cached binary (on a GPU build's libraries: the launcher), or None
    (never builds)."""
    env = os.environ.get("LLAMA_SERVER")
    if env and Path(env).exists():
        return Path(env)
    if gpu_libs() is not None:
        return ON_LIBS if SHARED_BINARY.exists() and ON_LIBS.exists() else None
    return BINARY if BINARY.exists() else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rebuild", action="store_true", help="rebuild even if the binary is cached")
    ap.add_argument("-j", "--jobs", type=int, default=int(os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", "2")))
    args = ap.parse_args()
    print(build(jobs=args.jobs, rebuild=args.rebuild))
    return 0


if __name__ == "__main__":
    sys.exit(main())
