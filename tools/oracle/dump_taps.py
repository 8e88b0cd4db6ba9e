#!/usr/bin/env python3
"""Dump Sparrow's tap names from transformers' DeepseekV4ForCausalLM (forward hooks).

For every fixture directory given, loads the checkpoint in float32 (a bf16 checkpoint is upcast,
as for the golden logits), runs ONE multi-token forward over the fixture's ids.npy with
use_cache=False, and writes `taps_hf.safetensors` next to it holding the intermediates that are
module outputs in transformers, under the names Sparrow uses (docs/debugging.md):

  embed                      [T, S, D]  embedding expanded to the hc_mult streams
  L<l>.hc_attn.post/.comb    [T, S], [T, S, S]
  L<l>.attn.in               [T, D]     input_layernorm output
  L<l>.attn.qr               [T, q]     q_a_norm output
  L<l>.attn.indexer.weights  [T, Hi]    scorer.weights_proj output (unscaled)
  L<l>.attn.indexer.scores   [T, C]     scorer output, -inf where not causally visible
  L<l>.attn.indexer.topk     [T, k]     indexer output (-1 = none)
  L<l>.attn.out              [T, D]     self_attn output
  L<l>.hc_ffn.post/.comb, L<l>.moe.in, L<l>.moe.router.experts/.weights, L<l>.moe.out
  L<l>.hc_ffn.out            [T, S, D]  decoder layer output
  head.hidden, logits

Selections (topk, experts) come in transformers' order; compare them as sets. Usage, on a machine
with torch and transformers >= 5.17:

  python3 tools/oracle/dump_taps.py tests/fixtures/csa tests/fixtures/mixed_hc2
"""
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file
from transformers import DeepseekV4ForCausalLM


def dump(fixture: Path) -> None:
    model = DeepseekV4ForCausalLM.from_pretrained(fixture).float().eval()
    cfg = model.config
    ids = torch.from_numpy(np.load(fixture / "ids.npy").astype(np.int64))[None, :]
    T = ids.shape[1]
    ratio_csa = cfg.compress_rates["compressed_sparse_attention"]
    taps: dict[str, torch.Tensor] = {}

    def put(name, value):
        taps[name] = value.detach().float().contiguous() if value.is_floating_point() else value.detach().to(torch.int32).contiguous()

    hooks = []

    def on(module, fn):
        # A forward hook that returns anything but None replaces the module's output: drop it.
        hooks.append(module.register_forward_hook(lambda m, a, o: (fn(m, a, o), None)[1]))

    on(model.model.embed_tokens, lambda m, a, o: put("embed", o[0][:, None, :].expand(-1, cfg.hc_mult, -1)))
    for l, layer in enumerate(model.model.layers):
        p = f"L{l}."
        on(layer.attn_hc, lambda m, a, o, p=p: (put(p + "hc_attn.post", o[0][0]), put(p + "hc_attn.comb", o[1][0])))
        on(layer.input_layernorm, lambda m, a, o, p=p: put(p + "attn.in", o[0]))
        on(layer.self_attn.q_a_norm, lambda m, a, o, p=p: put(p + "attn.qr", o[0]))
        on(layer.self_attn, lambda m, a, o, p=p: put(p + "attn.out", o[0][0]))
        comp = layer.self_attn.compressor
        if comp is not None and hasattr(comp, "indexer"):
            scorer = comp.indexer.scorer
            on(scorer.weights_proj, lambda m, a, o, p=p: put(p + "attn.indexer.weights", o[0]))

            def scores_hook(m, a, o, p=p):
                s = o[0].clone()  # [T, C]
                visible = (torch.arange(T)[:, None] + 1) // ratio_csa
                s[torch.arange(s.shape[1])[None, :] >= visible] = float("-inf")
                put(p + "attn.indexer.scores", s)

            on(scorer, scores_hook)
            on(comp.indexer, lambda m, a, o, p=p: put(p + "attn.indexer.topk", o[0]))
        on(layer.ffn_hc, lambda m, a, o, p=p: (put(p + "hc_ffn.post", o[0][0]), put(p + "hc_ffn.comb", o[1][0])))
        on(layer.post_attention_layernorm, lambda m, a, o, p=p: put(p + "moe.in", o[0]))
        on(layer.mlp.gate, lambda m, a, o, p=p: (put(p + "moe.router.weights", o[1]), put(p + "moe.router.experts", o[2])))
        on(layer.mlp, lambda m, a, o, p=p: put(p + "moe.out", o[0]))
        on(layer, lambda m, a, o, p=p: put(p + "hc_ffn.out", (o[0] if isinstance(o, tuple) else o)[0]))
    on(model.model.norm, lambda m, a, o: put("head.hidden", o[0]))
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits
    put("logits", logits[0])
    for h in hooks:
        h.remove()
    out = fixture / "taps_hf.safetensors"
    save_file(taps, str(out), metadata={"tap_order": ",".join(taps.keys())})
    print(f"{fixture.name}: {len(taps)} taps -> {out} ({out.stat().st_size} bytes)")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    torch.manual_seed(0)
    for arg in sys.argv[1:]:
        dump(Path(arg))
