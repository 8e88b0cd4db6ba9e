#!/usr/bin/env python3
"""Checks IndexerTrainer.attn_sup_loss (train.py) without transformers: stub modules stand in for
transformers' DeepSeek-V4 classes, so only torch is needed (Debian's python3-torch will do):

    /usr/bin/python3 tools/train_needle/tests/test_attn_sup.py

A question whose query points at the asked needle's entries gets a loss near 0, one pointing away a
large loss; the target entries are exactly those whose 8-token receptive field (4(w-1) .. 4w+3)
meets the needle; entries not yet visible and padded questions are ignored; gradients reach the
query path and the compressed entries.
"""
import os
import sys
import types

import torch

# ---- stubs for the transformers imports of train.py ---------------------------------------------
tf = types.ModuleType("transformers")
tf.__version__ = "stub"
tf.DeepseekV4Config = object
tf.DeepseekV4ForCausalLM = object
tf.utils = types.SimpleNamespace(logging=types.SimpleNamespace(disable_progress_bar=lambda: None))
mdv4 = types.ModuleType("transformers.models.deepseek_v4.modeling_deepseek_v4")
for name in ("DeepseekV4CSACompressor", "DeepseekV4HashRouter", "DeepseekV4Indexer"):
    setattr(mdv4, name, type(name, (), {}))
mdv4.apply_rotary_pos_emb = lambda q, cos, sin: q  # positions play no part in this check
sys.modules["transformers"] = tf
sys.modules["transformers.models"] = types.ModuleType("transformers.models")
sys.modules["transformers.models.deepseek_v4"] = types.ModuleType("transformers.models.deepseek_v4")
sys.modules["transformers.models.deepseek_v4.modeling_deepseek_v4"] = mdv4
sys.modules["transformers.models.deepseek_v4"].modeling_deepseek_v4 = mdv4
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import train  # noqa: E402

H, D, RATE = 2, 8, 4


class Attn(torch.nn.Module):
    def __init__(self, layer_idx):
        super().__init__()
        self.layer_idx = layer_idx
        self.head_dim = D
        self.scaling = D ** -0.5
        self.q_a_proj = torch.nn.Linear(H * D, H * D, bias=False)
        with torch.no_grad():
            self.q_a_proj.weight.copy_(torch.eye(H * D))
        self.q_a_norm = torch.nn.Identity()
        self.q_b_proj = torch.nn.Identity()
        self.q_b_norm = torch.nn.Identity()


def trainer_with(h, ckv):
    t = train.IndexerTrainer.__new__(train.IndexerTrainer)
    attn = Attn(1)
    comp = types.SimpleNamespace(compress_rate=RATE)
    t.csa = [(attn, comp)]
    t.cap = {1: {"h_live": h, "ckv_live": ckv, "pe": (None, None)}}
    return t, attn


def case(sign, S=64, T=16, qp=60, start=20, needle_len=7, pad=False):
    e = torch.randn(D)
    e = e / e.norm()
    h = torch.zeros(1, S, H * D)
    h[0, qp] = 50 * e.repeat(H)
    h.requires_grad_(True)
    ckv = torch.zeros(1, 1, T, D)
    target = [w for w in range(T) if 4 * w - 4 <= start + needle_len - 1 and 4 * w + 3 >= start]
    for w in range(T):
        ckv[0, 0, w] = (sign if w in target else -sign) * e
    ckv.requires_grad_(True)
    t, attn = trainer_with(h, ckv)
    qpos = torch.tensor([[qp, -1]]) if pad else torch.tensor([[qp]])
    starts = torch.tensor([[start, 0]]) if pad else torch.tensor([[start]])
    loss = t.attn_sup_loss(qpos, starts, needle_len)
    return loss, h, ckv, attn, target


def main():
    torch.manual_seed(0)
    loss, h, ckv, attn, target = case(+1)
    assert target == [5, 6, 7], target
    assert loss is not None and float(loss) < 1e-3, float(loss)
    bad, h3, ckv3, attn3, _ = case(-1)
    assert float(bad) > 5.0, float(bad)
    # gradients reach the query path and the entries, even when the target mass underflows
    bad.backward()
    assert h3.grad is not None and float(h3.grad.abs().sum()) > 0
    assert ckv3.grad is not None and float(ckv3.grad[0, 0, 5:8].abs().sum()) > 0
    assert attn3.q_a_proj.weight.grad is not None and float(attn3.q_a_proj.weight.grad.abs().sum()) > 0
    # a padded question changes nothing
    lp, *_ = case(+1, pad=True)
    assert abs(float(lp) - float(loss)) < 1e-6, (float(lp), float(loss))
    # entries not yet visible are not targets: the question sits before the needle's last entry
    # is complete (query at 25 sees entries w < 26 // 4 = 6, so only entry 5 of 5..7 counts)
    lv, *_ = case(+1, qp=25)
    assert float(lv) < 1e-3, float(lv)
    # no question at all
    t, _ = trainer_with(torch.zeros(1, 8, H * D), torch.zeros(1, 1, 2, D))
    assert t.attn_sup_loss(torch.tensor([[-1]]), torch.tensor([[0]]), 7) is None
    # make_batch's question positions and needle starts point at what they claim
    import numpy as np
    rng = np.random.default_rng(3)
    for fmt in ("vk", "kvk"):
        ids, mask, qpos, starts = train.make_batch(rng, 3, 512, "cpu", fmt, (4, 12), with_questions=True)
        nlen = train.NEEDLE_LEN + (fmt == "kvk")
        for b in range(3):
            for qp, st in zip(qpos[b].tolist(), starts[b].tolist()):
                if qp < 0:
                    continue
                key = int(ids[b, qp])
                assert int(ids[b, qp - 1]) == ord("?") and 65 <= key <= 90, (fmt, b, qp)
                needle = ids[b, st:st + nlen].tolist()
                assert needle[0] == ord("[") and needle[-1] == ord("]") and needle[-2] == key, (fmt, needle)
                assert float(mask[b, qp]) == 1.0
    print("attn_sup_loss and make_batch: all checks passed")


if __name__ == "__main__":
    main()
