"""Every Triton kernel compiled ahead of time for sm_80 (A100) and sm_90 (H100) on this machine, no GPU needed.

The launches are those a GPU step makes (kernels/aot.py runs each launcher with the GPU tile choices on meta
tensors of a model's widths); each must lower to a cubin and fit the target's shared memory per block. The table
of shared memory per kernel is printed (`pytest -s`) and by `python -m kernels.aot`."""
import pytest
import torch

pytest.importorskip("triton")

from kernels import aot  # noqa: E402

# SmolLM2 (head_dim 64) in bf16, Llama 3 8B (head_dim 128, GQA 4) in bf16 and in fp32 (the most shared memory):
# the tile constexprs of the other shapes are among these (Qwen2 7B differs only in G, which the tiles ignore;
# `python -m kernels.aot` prints every model x dtype).
CASES = [("smollm2-135m", torch.bfloat16), ("llama3-8b", torch.bfloat16), ("llama3-8b", torch.float32)]


@pytest.fixture(scope="module", params=CASES, ids=lambda c: f"{c[0]}-{str(c[1]).split('.')[-1]}")
def launches(request):
    model, dtype = request.param
    return aot.distinct(aot.model_launches(aot.MODEL_SHAPES[model], dtype))


def test_every_kernel_is_launched(launches):
    names = {la.name for la in launches}
    assert {"_rms_norm_kernel", "_rope_kernel", "_silu_and_mul_kernel", "_store_kv_kernel", "_paged_prefill_kernel",
            "_segment_merge_kernel", "_target_logprob_kernel", "_dequant_kernel"} <= names
    attention = [la for la in launches if la.name == "_segment_merge_kernel"]
    assert all(la.kwargs["BLOCK_R"] >= 64 for la in attention), "the launches must use the GPU tile choices"


@pytest.mark.parametrize("target", list(aot.TARGETS))
def test_compiles_and_fits_shared_memory(launches, target):
    rows, too_large = [], []
    for la in launches:
        c = aot.compile_launch(la, target)  # raises if the kernel does not lower
        assert c.ptx_lines > 0
        rows.append(f"{c.kernel:24} {c.num_warps} warps {c.shared / 1024:7.1f} KiB of {c.limit / 1024:.0f} KiB  "
                    + " ".join(f"{k}={v}" for k, v in c.constexprs.items()))
        if not c.fits:
            too_large.append(rows[-1])
    print(f"\n{target}:\n" + "\n".join(rows))
    assert not too_large, f"{target}: shared memory over the per-block limit:\n" + "\n".join(too_large)
