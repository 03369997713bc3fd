"""Session fixtures: tiny random HF model directories for every architecture, and the real SmolLM2 GGUF."""

from __future__ import annotations

import pytest
from tiny_models import ARCHS, make_tiny_model

from engine.errors import UserError
from engine.loader import default_model_path


@pytest.fixture(scope="session")
def tiny_model_dirs(tmp_path_factory) -> dict:
    """arch -> tiny HF model directory, for arch in llama, mistral, qwen2, llama3, smollm."""
    root = tmp_path_factory.mktemp("tiny_models")
    return {arch: make_tiny_model(root / arch, arch=arch, seed=i) for i, arch in enumerate(ARCHS)}


@pytest.fixture(scope="session")
def long_tiny_dir(tmp_path_factory):
    """A tiny llama whose context (4096 positions) holds a few many-shot judge prompts."""
    return make_tiny_model(tmp_path_factory.mktemp("long_tiny") / "llama", max_position_embeddings=4096)


@pytest.fixture(scope="session")
def tiny_model_dir(tiny_model_dirs):
    """A tiny random Llama HF model directory."""
    return tiny_model_dirs["llama"]


@pytest.fixture(scope="session")
def smollm2_path():
    """The embedded SmolLM2-135M-Instruct Q4_1 GGUF; tests using it are skipped when it is not installed."""
    try:
        return default_model_path()
    except UserError as e:
        pytest.skip(str(e))
