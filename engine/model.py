"""The Llama-family transformer (Llama 2/3, SmolLM, Mistral, Qwen2, Qwen3, Gemma-3 text) over packed
variable-length steps.

Gemma-3 differs in: the embedding scaled by sqrt(hidden) (rounded to the model dtype, as HF does), RMSNorm weights
stored as w and applied as (1 + w) (folded in at load), norms after attention and after the MLP as well as before,
GeGLU with the tanh-approximated GELU, the attention scale query_pre_attn_scalar ** -0.5, and local layers that
attend within a sliding window and rotate with their own rope base.

One forward step takes the new tokens of many sequences packed back to back (no padding) and an attention plan
(`StepBatch`): where their K/V go in the paged cache and which cached segments each sequence attends to. Only the
rows that are asked for leave the last layer: its attention output, o-projection and MLP run on those rows only
(the others' K/V are all the cache needs from it), and the LM head never runs on the others.

Deterministic mode (`deterministic=True`): every matmul, the attention and the target log-prob take their
batch-invariant forms (kernels/batch_invariant.py; the linears the native panels where they run), so a row's
result is bitwise the same whatever else the step holds, however the prefix tree is cut and whatever the token
budget. The mode is chosen once, in the kernels' dispatch (`kernels.StepKernels`); the model calls the kernels
only through their dispatch entry points."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F

import kernels

from .config import ModelConfig
from .kv_cache import KVCache
from .weights import read_as, release_free_memory, shape_of


@dataclass
class StepBatch:
    token_ids: torch.Tensor  # [T] int64: new tokens of all sequences, packed
    positions: torch.Tensor  # [T] int64: their absolute positions
    write_slots: torch.Tensor  # [T] int64: cache slots that receive their K/V
    cu_seqlens: list[int]  # sequence b owns rows cu_seqlens[b]:cu_seqlens[b+1]
    seq_starts: list[int]  # the absolute position of sequence b's first new token (the host's copy)
    segments: list[kernels.Segment]  # (query rows, cached slots) of each shared cached segment
    out_rows: torch.Tensor  # [N] int64: rows whose final hidden state is returned


class LlamaModel:
    def __init__(
        self,
        config: ModelConfig,
        weights: Mapping[str, torch.Tensor],
        dtype: torch.dtype,
        device,
        deterministic: bool = False,
        max_tokens: int | None = None,
    ):
        """`weights` by HF name: a plain dict, or the loader's LazyWeights, which reads a tensor from the file
        when asked. `max_tokens`: the longest sequence the model will run (the engine's `Limits`); the rotary
        tables are sized by it, not by the header's context length (up to 16M positions). Each tensor is read once, turned into its final dtype, device and layout (linears fused and
        prepacked where the mode packs) and dropped before the next: building never holds a second model copy."""
        self.config, self.dtype, self.device = config, dtype, torch.device(device)
        self.deterministic = deterministic
        self.ops = kernels.StepKernels(deterministic)
        c = config

        def w(name):
            return read_as(weights, name, dtype).to(device=self.device).contiguous()

        gemma = c.arch == "gemma3"

        def norm_w(name):  # Gemma's RMSNorm multiplies by (1 + w), in fp32 before the cast
            return (weights[name].float() + 1).to(device=self.device, dtype=dtype) if gemma else w(name)

        def fused(*names):  # rows of several linears in one matrix, in its final layout
            if len(names) == 1:
                plain = w(names[0])
            else:  # each part read into its rows: no second copy of the whole, as torch.cat would make
                shapes = [shape_of(weights, n) for n in names]
                plain = torch.empty(sum(s[0] for s in shapes), shapes[0][1], dtype=dtype, device=self.device)
                r0 = 0
                for n, (r, _) in zip(names, shapes):
                    plain[r0 : r0 + r] = w(n)
                    r0 += r
            out = self.ops.weight(plain)
            del plain
            release_free_memory()  # its unfused and unpacked forms, not kept resident by malloc until the next
            return out

        self.embed = w("model.embed_tokens.weight")
        self.lm_head = self.embed if c.tie_embeddings else w("lm_head.weight")
        self.norm = norm_w("model.norm.weight")
        self.layers = []
        for i in range(c.num_layers):
            p = f"model.layers.{i}."
            bias = torch.cat([w(p + f"self_attn.{n}_proj.bias") for n in "qkv"]) if c.attention_bias else None
            self.layers.append(
                dict(
                    attn_norm=norm_w(p + "input_layernorm.weight"),
                    q_norm=norm_w(p + "self_attn.q_norm.weight") if c.qk_norm else None,
                    k_norm=norm_w(p + "self_attn.k_norm.weight") if c.qk_norm else None,
                    qkv=fused(*(p + f"self_attn.{n}_proj.weight" for n in "qkv")),
                    qkv_bias=bias,
                    o=fused(p + "self_attn.o_proj.weight"),
                    # Gemma: post_attention_layernorm normalises the attention output; pre_feedforward_layernorm
                    # the MLP input, and post_feedforward_layernorm its output
                    post_attn_norm=norm_w(p + "post_attention_layernorm.weight") if gemma else None,
                    mlp_norm=norm_w(
                        p + ("pre_feedforward_layernorm.weight" if gemma else "post_attention_layernorm.weight")
                    ),
                    post_mlp_norm=norm_w(p + "post_feedforward_layernorm.weight") if gemma else None,
                    sliding=bool(c.sliding_layers[i]) if c.sliding_layers else False,
                    gate_up=fused(p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"),
                    down=fused(p + "mlp.down_proj.weight"),
                )
            )
        # the generation logits' copy of the LM head (the fused target log-prob reads the plain one in tiles),
        # packed on the first generation step: an engine that only scores never holds it
        self._logits_head = None
        positions = min(c.max_position, max_tokens or c.max_position)
        self.cos, self.sin = kernels.rope_cos_sin(c.head_dim, c.rope_theta, c.rope_scaling, positions, self.device)
        self.local_cos, self.local_sin = (
            kernels.rope_cos_sin(c.head_dim, c.rope_local_theta, None, positions, self.device)
            if any(c.sliding_layers)
            else (None, None)
        )
        self.scale = c.attention_scale
        # HF rounds sqrt(hidden) to the model dtype before scaling the embedding
        self.embed_scale = torch.tensor(c.hidden_size**0.5, dtype=dtype).item() if gemma else None

    @torch.inference_mode()
    def forward(self, batch: StepBatch, kv: KVCache) -> torch.Tensor:
        """Runs one step, writing K/V of the new tokens into `kv`; returns final-normed hidden [N, hidden]."""
        plan = kernels.AttentionPlan(
            batch.cu_seqlens, batch.segments, batch.positions, batch.write_slots, batch.seq_starts
        )
        window = None
        if kv.positions is not None:
            window = kernels.AttentionWindow(self.config.sliding_window, batch.positions, kv.positions)

        def attend(i, q, k, v, sliding):
            return self.ops.attention(q, k, v, kv.k[i], kv.v[i], plan, self.scale, window if sliding else None)

        return self._layers(batch.token_ids, batch.positions, batch.write_slots, kv, attend, batch.out_rows)

    @torch.inference_mode()
    def forward_decode(self, token_ids, positions, write_slots, kv: KVCache, table, lens) -> torch.Tensor:
        """A decode step in fixed shapes (engine/decode_graphs.py captures it in a CUDA graph): row b is one new
        token of a sequence whose cached context, its own new slot last, is table[b, :lens[b]] (the slot at index
        j holding position j); every row's final hidden state comes out. Every argument is a device tensor whose
        values a replay may change."""
        window = self.config.sliding_window or 0

        def attend(i, q, k, v, sliding):
            return kernels.paged_decode_attention(
                q, kv.k[i], kv.v[i], table, lens, self.scale, window if sliding else 0
            )

        return self._layers(token_ids, positions, write_slots, kv, attend, None)

    def _layers(self, token_ids, positions, write_slots, kv: KVCache, attend, rows) -> torch.Tensor:
        """The layers over the step's new tokens, `attend(layer, q, k, v, sliding)` computing each layer's attention
        once its K/V are stored; the last layer's work after its K/V store runs on `rows` only (None: all)."""
        c = self.config
        T = token_ids.shape[0]
        q_dim, kv_dim = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        linear = self.ops.linear
        h = F.embedding(token_ids, self.embed)
        if self.embed_scale is not None:
            h = h * self.embed_scale
        if kv.positions is not None:
            kv.positions[write_slots] = positions
        residual = None
        trim = rows is not None and rows.numel() < T
        for i, L in enumerate(self.layers):
            x, residual = kernels.rms_norm(h, L["attn_norm"], c.rms_norm_eps, residual)
            qkv = linear(x, L["qkv"], L["qkv_bias"])
            if L["q_norm"] is not None:  # per-head RMSNorm of queries and keys before the rotation (Qwen3)
                q = kernels.rms_norm(qkv[:, :q_dim].reshape(T * c.num_heads, c.head_dim), L["q_norm"], c.rms_norm_eps)[
                    0
                ]
                k = kernels.rms_norm(
                    qkv[:, q_dim : q_dim + kv_dim].reshape(T * c.num_kv_heads, c.head_dim), L["k_norm"], c.rms_norm_eps
                )[0]
                qkv = torch.cat([q.view(T, q_dim), k.view(T, kv_dim), qkv[:, q_dim + kv_dim :]], dim=1)
            cos, sin = (self.local_cos, self.local_sin) if L["sliding"] else (self.cos, self.sin)
            q, k, v = kernels.rope_store_kv(
                qkv, positions, cos, sin, kv.k[i], kv.v[i], write_slots, c.num_heads, c.num_kv_heads
            )
            last = trim and i == len(self.layers) - 1
            if last and rows.numel() == 0:
                return h.new_empty(0, c.hidden_size)
            attn = attend(i, q, k, v, L["sliding"])
            if last:
                attn, residual = attn[rows], residual[rows]
            h = linear(attn.reshape(-1, q_dim), L["o"])
            if L["post_attn_norm"] is not None:
                h = kernels.rms_norm(h, L["post_attn_norm"], c.rms_norm_eps)[0]
            x, residual = kernels.rms_norm(h, L["mlp_norm"], c.rms_norm_eps, residual)
            if L["post_mlp_norm"] is not None:  # GeGLU (tanh GELU), then the post-MLP norm
                gate, up = linear(x, L["gate_up"]).chunk(2, dim=-1)
                h = linear(F.gelu(gate, approximate="tanh") * up, L["down"])
                h = kernels.rms_norm(h, L["post_mlp_norm"], c.rms_norm_eps)[0]
            else:
                h = linear(kernels.silu_and_mul(linear(x, L["gate_up"])), L["down"])
        out, _ = kernels.rms_norm(h, self.norm, c.rms_norm_eps, residual)
        return out

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Full-vocabulary logits (the model's dtype) of a few final hidden rows: the rows that sample a token."""
        if self._logits_head is None:  # a one-off reorder (SmolLM2 fp32: 0.15 s), then kept
            self._logits_head = self.ops.weight(self.lm_head)
        return self.ops.logits(hidden, self._logits_head)

    def target_logprobs(self, hidden: torch.Tensor, targets: torch.Tensor, top_k: int = 0) -> kernels.LogProbs:
        """log P(target) (fp32) and is_greedy of each final hidden row, and with top_k the k best tokens: the LM
        head fused with the log-softmax, in vocabulary tiles (kernels.target_logprobs)."""
        return self.ops.target_logprobs(hidden, self.lm_head, targets, top_k)
