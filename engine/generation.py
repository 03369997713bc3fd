"""Text generation on the same prefix-shared paged cache: greedy or temperature / top-p sampling.

Every prompt but its last token goes into the prefix tree, so prompts that share a prefix (a many-shot judge's
demos, n samples of one prompt) compute it once. Each sequence then grows a private node that starts with the
prompt's last token; a decode step feeds one token of every active sequence."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tqdm import tqdm

from .errors import UserError
from .planner import Planner, drop, keep_cached
from .prefix_tree import Node, insert
from .step import build_step


@dataclass
class Generation:
    text: str
    token_ids: list[int]
    finish_reason: str  # "stop" (a stop string), "eos", or "length"


def sample(logits: torch.Tensor, temperature: float, top_p: float, gen: torch.Generator | None) -> int:
    """One token from fp32 logits [V]: argmax at temperature 0, else nucleus sampling."""
    if temperature <= 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits / temperature, dim=-1)
    if top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        keep = torch.cumsum(sorted_p, 0) - sorted_p < top_p  # smallest set whose mass reaches top_p
        probs = torch.zeros_like(probs).scatter_(0, order[keep], sorted_p[keep])
    return int(torch.multinomial(probs, 1, generator=gen))


def _encode_prompt(eng, prompt) -> list[int]:
    tok = eng.tokenizer
    ids = tok.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
    if (isinstance(prompt, str) and tok.add_bos and tok.bos_id is not None) or not ids:
        ids = [tok.bos_id if tok.bos_id is not None else tok.eos_id] + ids
    if len(ids) >= eng.config.max_position:
        raise UserError(f"prompt of {len(ids)} tokens leaves no room under the model's maximum of "
                        f"{eng.config.max_position}")
    return ids


def generate(eng, prompts, max_tokens=128, temperature=0.0, top_p=1.0, seed=None, stop=None, progress=False):
    encoded = [_encode_prompt(eng, p) for p in prompts]
    stop = [s for s in (stop or []) if s]
    eos = set(eng.tokenizer.eos_ids) | ({eng.tokenizer.eos_id} if eng.tokenizer.eos_id is not None else set())
    root = eng.root if eng.options.keep_cache else Node([], None, 0)
    planner = Planner(root, eng.kv, eng.options.token_budget, eng.options.keep_cache, eng.last_stats)
    seqs = []
    for i, ids in enumerate(encoded):
        parent = insert(root, ids[:-1], len(ids) - 1, eng.kv)[1][-1] if len(ids) > 1 else root
        node = Node([ids[-1]], parent, len(ids) - 1)
        node.key, node.private = ("gen", i), True
        node.slots = torch.empty(min(max_tokens, eng.config.max_position - len(ids)) + 1, dtype=torch.long)
        parent.children[node.key] = node
        parent.open_children += 1
        rng = None
        if temperature > 0:
            rng = torch.Generator().manual_seed(seed + i if seed is not None else int(torch.seed()) + i)
        seqs.append(dict(node=node, out=[], rng=rng, reason=None, text=""))
    try:
        planner.run(lambda chunks: eng.model.forward(build_step(chunks, eng.device)[0], eng.kv))
        active = list(range(len(seqs)))
        bar = tqdm(total=len(seqs) * max_tokens, unit="tok", desc="generating", disable=not progress)
        while active:
            for i in active:
                node = seqs[i]["node"]
                while not node.ensure_slots(node.done + 1, eng.kv):
                    if not planner.evict_cached(eng.kv.page_size):
                        raise MemoryError("KV cache exhausted during generation: raise kv_tokens")
                node.rows = [(node.done, i, 0, -1)]
            batch, scored = build_step([(seqs[i]["node"], seqs[i]["node"].done, seqs[i]["node"].done + 1)
                                        for i in active], eng.device)
            logits = F.linear(eng.model.forward(batch, eng.kv), eng.model.lm_head).float()
            eng.last_stats["forward_steps"] += 1
            eng.last_stats["tokens_computed"] += len(active)
            still = []
            for row, i in zip(range(len(active)), active):
                s, node = seqs[i], seqs[i]["node"]
                node.done += 1
                node.rows = []
                token = sample(logits[row], temperature, top_p, s["rng"])
                s["reason"] = _finish_reason(eng, s, token, eos, stop, max_tokens)
                if s["reason"] is None:
                    node.tokens.append(token)
                    still.append(i)
                else:
                    planner.finish_private(node)
            bar.update(len(active))
            active = still
        bar.close()
    finally:
        if eng.options.keep_cache:
            keep_cached(root, eng.kv)
        else:
            for child in list(root.children.values()):
                drop(child, eng.kv)
    return [Generation(s["text"] if s["reason"] == "stop" else eng.tokenizer.decode(s["out"], skip_special_tokens=True),
                       s["out"], s["reason"]) for s in seqs]


def _finish_reason(eng, s: dict, token: int, eos: set, stop: list[str], max_tokens: int) -> str | None:
    if token in eos:
        return "eos"
    s["out"].append(token)
    if stop:
        text = eng.tokenizer.decode(s["out"], skip_special_tokens=True)
        cut = min((at for at in (text.find(st) for st in stop) if at >= 0), default=-1)
        if cut >= 0:
            s["text"] = text[:cut]
            return "stop"
    node = s["node"]
    if len(s["out"]) >= max_tokens or node.start + len(node) >= eng.config.max_position:
        return "length"
    return None
