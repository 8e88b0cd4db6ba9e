#!/usr/bin/env python3
"""Per-digit accuracy of a trained needle model, split by the needle's offset modulo the CSA rate."""
import sys
import os
import numpy as np
import torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import needle_prompts  # noqa: E402
from transformers import DeepseekV4ForCausalLM  # noqa: E402

# usage: diagnose.py MODEL_DIR [vk|kvk]  (the needle format the model was trained on; default vk)
fmt = sys.argv[2] if len(sys.argv) > 2 else "vk"
model = DeepseekV4ForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32).cuda().eval()
for L in (512, 2048):
    per_digit = np.zeros(3)
    by_mod = {}
    n = 64
    with torch.no_grad():
        for t in range(n):
            full, plen, ans, info = needle_prompts.make_prompt(1234, L, t, n, fmt)
            ids = torch.tensor([full]).cuda()
            lg = model(input_ids=ids, use_cache=False).logits[0]
            pred = lg[[plen - 1, plen, plen + 1]].argmax(-1).cpu().numpy()
            ok = pred == np.array(full[plen:plen + 3])
            per_digit += ok
            m = info["needle_pos"] % 4
            by_mod.setdefault(m, []).append(ok.all())
    print(L, "per-digit acc", (per_digit / n).round(3).tolist(),
          "recall by needle_pos%4", {k: (round(float(np.mean(v)), 2), len(v)) for k, v in sorted(by_mod.items())})
