"""Shared fixtures: tiny offline models saved to temporary directories."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# the CLI's --threads auto keeps a set OMP_NUM_THREADS: commands run in-process (and their subprocesses) stay at the
# suite's one thread per worker
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

# Tiny models on a shared 2-core machine: one thread is 10-50x faster than oversubscribing.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory):
    from gather_aggregate.testing.tiny_models import save_model_dir, tiny_llama

    hf, tok = tiny_llama()
    return save_model_dir(hf, tok, tmp_path_factory.mktemp("tiny_llama"))


@pytest.fixture(scope="session")
def tiny_gpt2_dir(tmp_path_factory):
    from gather_aggregate.testing.tiny_models import save_model_dir, tiny_gpt2

    hf, tok = tiny_gpt2()
    return save_model_dir(hf, tok, tmp_path_factory.mktemp("tiny_gpt2"))


@pytest.fixture(scope="session")
def llama_model(tiny_llama_dir):
    from gather_aggregate import load_model

    return load_model(tiny_llama_dir)
