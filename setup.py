"""Install with `pip install --no-build-isolation -e .` after torch (see Makefile): the native CPU ops are built
from CMakeLists.txt against the installed torch, and build isolation would fetch a second, unpinned torch."""
from setuptools import find_packages, setup

setup(
    name="icqs-engine",
    version="0.1.0",
    description="Prefix-sharing Llama inference engine for continuation log-probs, and the ICQS evaluation toolkit",
    packages=find_packages(include=["engine", "engine.*", "kernels", "kernels.*", "icqs", "icqs.*"]),
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
        "scipy",
        "scikit-learn",
        "matplotlib",
    ],
    extras_require={
        "test": ["pytest", "pytest-benchmark", "transformers", "accelerate", "triton"],
        "triton": ["triton"],
        "bench": ["llama-cpp-python", "transformers", "pytest-benchmark"],
        "cuda": ["flash-attn"],
    },
    entry_points={"console_scripts": ["icqs=icqs.cli:main"]},
)
