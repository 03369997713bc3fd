"""Memory and time of Engine.load: peak and resident RSS over the bytes of the weights the model ends up holding,
and load seconds, each (model, dtype) in a fresh interpreter.

  python benchmarks/bench_load.py                       # SmolLM2, Qwen2.5-0.5B, Qwen2.5-1.5B; bf16 and fp32
  python benchmarks/bench_load.py --models smollm2 --dtypes float32
  python benchmarks/bench_load.py --root /path/to/other/checkout   # the same measurement of another engine
  python benchmarks/bench_load.py --device-proxy       # and the host's peak when the weights go to another device
  python benchmarks/bench_load.py --llama8b /big/disk/dir          # writes a random Llama-3-8B-shaped bf16
                                                                   # safetensors (16 GiB) there, loads it in bf16

baseline: the child's RSS after importing torch and the engine, one small bf16 matmul (oneDNN's code and JIT
kernels, a fixed ~18 MiB that is the runtime's, not the weights'), one load of the same model dropped again (the
runtime's first-use costs at its shapes: oneDNN's kernel per GEMM shape, the engine's first run; a leak would show
again in the measured load) and giving the C heap's free pages back.
peak: the high-water mark of RSS during Engine.load (reset just before it, /proc/self/clear_refs). resident: RSS
after the load (and a gc). Ratios are (peak - baseline) / weight bytes and (resident - baseline) / weight bytes.
own/w: what the load itself keeps, = the growth of anonymous memory (RssAnon: tensors, heap) plus the model
file's pages still mapped, over the weight bytes. It leaves out the shared libraries' code pages that the load
runs for the first time (RssFile: 8-14 MiB here, varying with the page cache between checkouts of the same
venv), which RSS counts but which are the runtime's, like oneDNN's code above;
weight bytes count every tensor the model holds once (a prepacked copy as its blocked tensor). The KV cache is
allocated uninitialised, so its untouched pages cost nothing here.
seconds: the measured load's, the second of the child: the checkpoint's pages are in the OS page cache by then (a
load from a cold disk takes longer; the load made first costs the child as much time again).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = {"smollm2": None, "qwen2.5-0.5b": "qwen2.5-0.5b", "qwen2.5-1.5b": "qwen2.5-1.5b"}
LLAMA8B = dict(
    vocab_size=128256,
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
)


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def weight_bytes(model) -> int:
    """Bytes of the distinct tensors the model holds (a Packed weight counted by its blocked tensor)."""
    import torch

    seen: dict[int, int] = {}

    def add(t):
        t = getattr(t, "blocked", t)  # a oneDNN tensor (no storage to point at: counted by its elements)
        if isinstance(t, torch.Tensor):
            seen[id(t)] = t.numel() * t.element_size()

    for value in vars(model).values():
        add(value)
    for layer in model.layers:
        for value in layer.values():
            add(value)
    return sum(seen.values())


def child(model: str | None, dtype: str) -> dict:
    """One measurement in this (fresh) interpreter."""
    import gc

    import torch

    from engine.engine import Engine
    from kernels.linear import linear, prepack

    x = torch.ones(3, 64, dtype=torch.bfloat16)  # oneDNN's code and JIT kernels: the runtime's, not the weights'
    linear(x, prepack(torch.ones(64, 64, dtype=torch.bfloat16)))
    # The runtime's first-use costs at this model's shapes, kept after the engine is gone: oneDNN JITs and caches a
    # kernel per new GEMM shape (1.85 MiB each on an AVX-512 Zen4, where the bf16 linears go through oneDNN; an
    # AVX2 build's panels keep none), and the engine's first run keeps ~6 MiB more (SmolLM2 on that Zen4: own/w
    # 1.083 cold, 1.052 warm). A load made and dropped first puts them in the baseline; a leak of the load would
    # show again in the measured one.
    Engine.load(model, dtype=dtype, threads=1)
    gc.collect()
    ctypes.CDLL(None).malloc_trim(0)  # the imports' free heap pages out of the baseline
    baseline, anon_before = _status("VmRSS"), _status("RssAnon")
    with open("/proc/self/clear_refs", "w") as f:  # resets VmHWM to the current RSS
        f.write("5")
    t0 = time.perf_counter()
    engine = Engine.load(model, dtype=dtype, threads=1)
    seconds = time.perf_counter() - t0
    peak = _status("VmHWM")
    gc.collect()
    resident = _status("VmRSS")
    own = _status("RssAnon") - anon_before + _mapped_file_rss(engine_files(model))
    wb = weight_bytes(engine.model)
    return dict(
        model=model or "smollm2",
        dtype=dtype,
        weight_bytes=wb,
        baseline=baseline,
        peak=peak,
        resident=resident,
        peak_ratio=(peak - baseline) / wb,
        resident_ratio=(resident - baseline) / wb,
        own=own,
        own_ratio=own / wb,
        seconds=seconds,
    )


def engine_files(model: str | None) -> set[str]:
    """The checkpoint's files (resolved paths): the GGUF, or every file of an HF directory."""
    from engine.loader import resolve_model_path

    path = resolve_model_path(model).resolve()
    return {str(p.resolve()) for p in path.iterdir()} if path.is_dir() else {str(path)}


def _mapped_file_rss(files: set[str]) -> int:
    """Resident bytes of this process's mappings of these files (/proc/self/smaps)."""
    total, current = 0, None
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if len(head) >= 5 and "-" in head[0] and not head[0].endswith(":"):
                current = head[5] if len(head) > 5 else None
            elif head and head[0] == "Rss:" and current in files:
                total += int(head[1]) * 1024
    return total


def device_child(model: str | None, dtype: str) -> dict:
    """The host side of a load onto an accelerator, with the meta device standing in for it (no data lands
    anywhere, so RSS shows only what the host holds on the way): the peak above the RSS after the checkpoint is
    opened and the tokenizer loaded, over the bytes of the largest checkpoint tensor in `dtype`."""
    import gc

    import torch

    from engine.engine import DTYPES
    from engine.loader import load_model_files
    from engine.model import LlamaModel

    config, weights, _ = load_model_files(model)
    # the first meta-device ops import torch's meta kernels (~130 MiB of Python): the runtime's, not the load's
    import kernels

    meta = torch.ones(4, 4, dtype=DTYPES[dtype]).to("meta")
    torch.cat([meta, meta]).contiguous().float()
    kernels.rope_cos_sin(8, 10000.0, None, 4, torch.device("meta"))
    # and the readers' code (each tensor type's dequantizer, the casts): the embedding and layer 0 read once and
    # dropped, so that the libraries' code pages they fault in (8-15 MiB, varying with the page cache between
    # checkouts) are in the baseline, as the runtime's
    for name in [n for n in weights if ".layers.0." in n or "embed_tokens" in n]:
        (weights.read(name, DTYPES[dtype]) if hasattr(weights, "read") else weights[name]).to("meta")
    gc.collect()
    ctypes.CDLL(None).malloc_trim(0)
    baseline = _status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    LlamaModel(config, weights, DTYPES[dtype], torch.device("meta"))
    peak = _status("VmHWM")
    largest = max(torch.Size(weights.shape(n)).numel() for n in weights) * DTYPES[dtype].itemsize
    return dict(
        model=model or "smollm2",
        dtype=dtype,
        largest_tensor=largest,
        host_peak=peak - baseline,
        host_peak_ratio=(peak - baseline) / largest,
    )


def run_child(root: Path, model: str | None, dtype: str, fn: str = "child") -> dict:
    env = dict(os.environ, PYTHONPATH=str(root))
    code = (
        f"import sys, json; sys.path.insert(0, {str(Path(__file__).parent)!r}); import bench_load; "
        f"print(json.dumps(bench_load.{fn}({model!r}, {dtype!r})))"
    )
    run = subprocess.run([sys.executable, "-c", code], env=env, cwd=root, capture_output=True, text=True)
    if run.returncode != 0:
        raise SystemExit(f"load of {model} {dtype} failed:\n{run.stderr[-3000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def write_llama8b(folder: Path) -> Path:
    """A random-weight HF directory at Llama-3-8B's shapes in bf16 (about 16 GiB of safetensors in shards of a few
    layers each, written shard by shard so that at most one shard is in memory), with a small word-level
    tokenizer (the engine does not need the vocabulary to match for a load)."""
    import torch
    from safetensors.torch import save_file
    from tokenizers import Tokenizer, models

    folder.mkdir(parents=True, exist_ok=True)
    c = LLAMA8B
    h, inter, q = c["hidden_size"], c["intermediate_size"], c["num_attention_heads"] * c["head_dim"]
    kv = c["num_key_value_heads"] * c["head_dim"]
    gen = torch.Generator().manual_seed(0)

    def rand(*shape):
        return (torch.randn(*shape, generator=gen, dtype=torch.float32) * 0.02).bfloat16()

    weight_map: dict[str, str] = {}

    def save(tensors: dict) -> None:
        name = f"model-{len(set(weight_map.values())):05d}.safetensors"
        save_file(tensors, str(folder / name))
        weight_map.update(dict.fromkeys(tensors, name))

    save({"model.embed_tokens.weight": rand(c["vocab_size"], h)})
    layers = c["num_hidden_layers"]
    for start in range(0, layers, 4):  # one shard of four layers in memory at a time
        tensors = {}
        for i in range(start, min(layers, start + 4)):
            p = f"model.layers.{i}."
            tensors.update(
                {
                    p + "input_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
                    p + "post_attention_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
                    p + "self_attn.q_proj.weight": rand(q, h),
                    p + "self_attn.k_proj.weight": rand(kv, h),
                    p + "self_attn.v_proj.weight": rand(kv, h),
                    p + "self_attn.o_proj.weight": rand(h, q),
                    p + "mlp.gate_proj.weight": rand(inter, h),
                    p + "mlp.up_proj.weight": rand(inter, h),
                    p + "mlp.down_proj.weight": rand(h, inter),
                }
            )
        save(tensors)
        del tensors
    save({"model.norm.weight": torch.ones(h, dtype=torch.bfloat16), "lm_head.weight": rand(c["vocab_size"], h)})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (folder / "config.json").write_text(
        json.dumps(
            dict(
                LLAMA8B,
                model_type="llama",
                architectures=["LlamaForCausalLM"],
                rms_norm_eps=1e-5,
                rope_theta=500000.0,
                max_position_embeddings=8192,
                tie_word_embeddings=False,
                bos_token_id=0,
                eos_token_id=1,
            )
        )
    )
    vocab = {"<s>": 0, "</s>": 1, "<unk>": 2}
    Tokenizer(models.WordLevel(vocab, unk_token="<unk>")).save(str(folder / "tokenizer.json"))
    return folder


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"], choices=["bfloat16", "float32"])
    ap.add_argument("--root", type=Path, default=ROOT, help="checkout whose engine is measured (default: this one)")
    ap.add_argument(
        "--llama8b",
        type=Path,
        help="folder for the random Llama-3-8B-shaped checkpoint (16 GiB): "
        "written if absent, then loaded in bf16 instead of --models",
    )
    ap.add_argument("--json", action="store_true", help="one JSON object per measurement")
    ap.add_argument(
        "--device-proxy",
        action="store_true",
        help="also the host peak of each load onto the meta device, the stand-in for an accelerator (no GPU here)",
    )
    args = ap.parse_args()
    if args.llama8b:
        if not (args.llama8b / "config.json").is_file():
            t0 = time.perf_counter()
            write_llama8b(args.llama8b)
            print(f"wrote {args.llama8b} in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        cases = [(str(args.llama8b), "bfloat16")]
    else:
        cases = [(MODELS[m], d) for m in args.models for d in args.dtypes]
    print(f"# {os.uname().nodename} load average {os.getloadavg()[0]:.2f}; engine from {args.root}")
    if not args.json:
        print(
            f"{'model':<14} {'dtype':<9} {'weights':>9} {'base':>8} {'peak':>9} {'resident':>9} "
            f"{'peak/w':>7} {'res/w':>6} {'own/w':>6} {'seconds':>8}"
        )
    gib = 2**30
    for model, dtype in cases:
        r = run_child(args.root.resolve(), model, dtype)
        r["model"] = Path(r["model"]).name
        if args.json:
            print(json.dumps(r), flush=True)
        else:
            print(
                f"{r['model']:<14} {dtype:<9} {r['weight_bytes'] / gib:7.2f}Gi {r['baseline'] / gib:6.2f}Gi "
                f"{(r['peak'] - r['baseline']) / gib:7.2f}Gi {(r['resident'] - r['baseline']) / gib:7.2f}Gi "
                f"{r['peak_ratio']:7.2f} {r['resident_ratio']:6.2f} {r.get('own_ratio', float('nan')):6.2f} "
                f"{r['seconds']:8.1f}",
                flush=True,
            )
    if args.device_proxy:
        print("# host peak of a load onto another device (meta standing in for CUDA), over the largest tensor")
        for model, dtype in cases:
            r = run_child(args.root.resolve(), model, dtype, "device_child")
            print(
                f"{Path(r['model']).name:<14} {dtype:<9} largest tensor {r['largest_tensor'] / gib:6.3f}Gi "
                f"host peak {r['host_peak'] / gib:6.3f}Gi = {r['host_peak_ratio']:.2f}x",
                flush=True,
            )
    print(f"# load average after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
