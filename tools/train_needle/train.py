#!/usr/bin/env python3
"""Train a tiny DeepSeek-V4 (transformers 5.17 `DeepseekV4ForCausalLM`) that retrieves needles.

See tools/train_needle/README.md.  In short:

* model: 4 layers [sliding, CSA, HCA, CSA], MLPs [hash, hash, scored, scored], hc_mult 4,
  byte-level vocabulary (256 bytes + 4 specials = 260 ids);
* data: a haystack of random lower-case filler words, 2..6 needles "[123K]" (a 3-digit value, then
  a one-letter upper-case key K; value before key so that a local attention can fold the value
  into the key token) at random depths, then one question line per needle "?K123\n" in a random
  order; the loss is cross-entropy on the three value digits of every question only;
* Lightning Indexer training as in DeepSeek's DSA: the indexer's inputs are detached, and its
  scores over the compressed entries get a KL loss towards the main attention's (head-summed,
  L1-normalised) probability mass on those entries, recomputed *densely* over every causally
  visible entry.  Phase 1 ("dense warm-up") runs the CSA layers with index_topk raised above the
  entry count, so the main attention learns on all entries while the indexer learns to imitate it;
  phase 2 ("sparse") runs with the real index_topk, so the main model learns under the indexer's
  selection (the KL loss continues).
* seeded; curves go to train_log.jsonl; the checkpoint is written with save_pretrained (float32).
* evaluation: Recall@1 per length with transformers' multi-token forward (use_cache=False,
  float32, TF32 off): a prompt with 4 needles and one question "?K", the three answer digits
  teacher-forced;
  a trial counts when the argmax at all three answer positions is right (the same as greedy
  decoding the three digits).
"""

import argparse
import json
import math
import os
import random
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import transformers  # noqa: E402
from transformers import DeepseekV4Config, DeepseekV4ForCausalLM  # noqa: E402
from transformers.models.deepseek_v4 import modeling_deepseek_v4 as mdv4  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import needle_prompts  # noqa: E402

SL, CSA, HCA = "sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"

# ------------------------------------------------------------------------------------------------
# Tokenizer: bytes 0..255 are ids 0..255; four specials after them.
# ------------------------------------------------------------------------------------------------
BOS, EOS, PAD, UNUSED = 256, 257, 258, 259
VOCAB = 260

TOKENIZER_DESC = {
    "type": "byte-level",
    "vocab_size": VOCAB,
    "description": "id b (0..255) is the byte b of the UTF-8 text; no merges, no normalisation",
    "special_tokens": {"<bos>": BOS, "<eos>": EOS, "<pad>": PAD, "<unused>": UNUSED},
    "add_bos": True,
    "add_eos": False,
}


def encode(text):
    return list(text.encode("utf-8"))


# ------------------------------------------------------------------------------------------------
# Config
# ------------------------------------------------------------------------------------------------
CFG = dict(
    hidden=128, heads=4, head_dim=64, partial_rotary=0.25, q_lora=64, o_groups=2, o_lora=32,
    index_heads=4, index_head_dim=32, index_topk=16, experts=8, topk_experts=2, moe_inter=128,
    window=64, csa_rate=4, hca_rate=32, max_pos=16384,
    rope_theta=10000.0, compress_theta=160000.0, yarn_factor=4.0, yarn_orig=4096,
    layers=[SL, CSA, HCA, CSA], mlp=["hash_moe", "hash_moe", "moe", "moe"], hc=4,
    swiglu_limit=10.0, routed_scale=1.5,
)


def build_config(c=None):
    c = c or CFG
    rope = {
        "main": {"rope_type": "default", "rope_theta": c["rope_theta"], "partial_rotary_factor": c["partial_rotary"]},
        "compress": {
            "rope_type": "yarn", "rope_theta": c["compress_theta"], "factor": c["yarn_factor"],
            "original_max_position_embeddings": c["yarn_orig"], "beta_fast": 32.0, "beta_slow": 1.0,
            "attention_factor": 1.0, "partial_rotary_factor": c["partial_rotary"],
        },
    }
    return DeepseekV4Config(
        vocab_size=VOCAB, hidden_size=c["hidden"], num_hidden_layers=len(c["layers"]),
        num_attention_heads=c["heads"], num_key_value_heads=1, head_dim=c["head_dim"],
        q_lora_rank=c["q_lora"], o_groups=c["o_groups"], o_lora_rank=c["o_lora"],
        index_n_heads=c["index_heads"], index_head_dim=c["index_head_dim"], index_topk=c["index_topk"],
        n_routed_experts=c["experts"], num_experts_per_tok=c["topk_experts"], n_shared_experts=1,
        moe_intermediate_size=c["moe_inter"], scoring_func="sqrtsoftplus", norm_topk_prob=True,
        routed_scaling_factor=c["routed_scale"], sliding_window=c["window"], hc_mult=c["hc"],
        hc_sinkhorn_iters=20, hc_eps=1e-6, swiglu_limit=c["swiglu_limit"],
        max_position_embeddings=c["max_pos"], rope_theta=c["rope_theta"],
        compress_rope_theta=c["compress_theta"], partial_rotary_factor=c["partial_rotary"],
        compress_rates={CSA: c["csa_rate"], HCA: c["hca_rate"]}, layer_types=list(c["layers"]),
        mlp_layer_types=list(c["mlp"]), num_nextn_predict_layers=0, initializer_range=0.02,
        rms_norm_eps=1e-6, tie_word_embeddings=False, hidden_act="silu", rope_parameters=rope,
        bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD,
    )


def init_extra(model, cfg, seed):
    """What _init_weights leaves degenerate: hash table (all zeros → expert 0 twice), sinks etc."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, mod in model.named_modules():
            if isinstance(mod, mdv4.DeepseekV4HashRouter):
                rows, k = mod.tid2eid.shape
                table = torch.rand((rows, cfg.n_routed_experts), generator=g).argsort(dim=1)[:, :k]
                mod.tid2eid.copy_(table)


# ------------------------------------------------------------------------------------------------
# Data
# ------------------------------------------------------------------------------------------------
FILLER_ALPHABET = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", dtype=np.uint8)
UPPER = np.frombuffer(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ", dtype=np.uint8)
DIGITS = np.frombuffer(b"0123456789", dtype=np.uint8)
NEEDLE_LEN = 6  # "[123K]": value first, then the one-letter key
QUESTION_LEN = 6  # "?K123\n"


def filler(rng, n):
    """Random lower-case 'words' of 2..8 letters separated by spaces (and an occasional '. ')."""
    out = np.empty(n, dtype=np.uint8)
    i = 0
    while i < n:
        w = int(rng.integers(2, 9))
        out[i:i + w] = rng.choice(FILLER_ALPHABET, size=min(w, n - i))
        i += w
        if i < n:
            out[i] = ord(" ")
            i += 1
    return out


def make_keys(rng, n):
    return [bytes([int(c)]) for c in rng.choice(UPPER, n, replace=False)]


def make_sample(rng, length, n_needles, n_questions, depths=None, fmt="vk"):
    """Return (ids int64 [length], answer positions list, needle info).

    Layout: <bos> haystack-with-needles questions.  The questions take n_questions*QUESTION_LEN bytes at the
    end; the last question is the one whose answer ends at the last position.
    `depths`: optional list of fractions in [0,1] for the needles (else uniform random).
    Answer positions p are those whose *target* is a value digit: logits[p] predicts ids[p+1].
    """
    q_bytes = n_questions * QUESTION_LEN
    hay_len = length - 1 - q_bytes
    needle_len = NEEDLE_LEN + (fmt == "kvk")
    assert hay_len > n_needles * (needle_len + 2) + 16, "length too short"
    hay = filler(rng, hay_len)
    keys = make_keys(rng, n_needles)
    vals = [bytes(rng.choice(DIGITS, 3)) for _ in range(n_needles)]
    # non-overlapping needle slots: pick sorted starts with gaps
    slots = hay_len - n_needles * (needle_len + 1)
    if depths is None:
        starts = np.sort(rng.integers(0, slots, size=n_needles))
        order = rng.permutation(n_needles)
    else:
        starts = np.array(sorted(int(d * (slots - 1)) for d in depths))
        order = np.arange(n_needles)
    starts = starts + np.arange(n_needles) * (needle_len + 1)
    needle_pos = {}
    for j, s in enumerate(starts):
        idx = order[j]
        needle = needle_prompts.needle_bytes(fmt, keys[idx][0], list(vals[idx]))
        hay[s:s + needle_len] = np.array(needle, dtype=np.uint8)
        needle_pos[idx] = int(s)
    q_order = rng.permutation(n_needles)[:n_questions] if depths is None else np.arange(n_questions)
    qs = b"".join(b"?" + keys[i] + vals[i] + b"\n" for i in q_order)
    ids = np.concatenate([[BOS], hay.astype(np.int64), np.frombuffer(qs, dtype=np.uint8).astype(np.int64)])
    assert len(ids) == length
    qstart = 1 + hay_len
    answer_pos = []
    for qi in range(n_questions):
        base = qstart + qi * QUESTION_LEN  # '?'
        for d in range(3):  # digit at base+2+d is predicted from position base+1+d
            answer_pos.append(base + 1 + d)
    info = [dict(key=keys[i].decode(), value=vals[i].decode(), pos=needle_pos[i] + 1) for i in q_order]
    return ids, answer_pos, info


def make_batch(rng, batch, length, device, fmt="vk", needles=(2, 6), with_questions=False):
    """ids [B, L], answer mask [B, L]; with_questions: also (question key positions [B, Q] padded
    with -1, needle start positions [B, Q]) for attention supervision."""
    ids, mask, qpos, starts = [], [], [], []
    for _ in range(batch):
        n = int(rng.integers(needles[0], needles[1] + 1))
        x, ap, info = make_sample(rng, length, n, n, fmt=fmt)
        m = np.zeros(length, dtype=np.float32)
        m[ap] = 1.0
        ids.append(x)
        mask.append(m)
        qpos.append(ap[0::3])  # the question's key letter predicts the first digit
        starts.append([inf["pos"] for inf in info])
    ids = torch.from_numpy(np.stack(ids)).to(device)
    mask = torch.from_numpy(np.stack(mask)).to(device)
    if not with_questions:
        return ids, mask
    Q = max(len(q) for q in qpos)
    qp = np.full((batch, Q), -1, dtype=np.int64)
    st = np.zeros((batch, Q), dtype=np.int64)
    for b in range(batch):
        qp[b, :len(qpos[b])] = qpos[b]
        st[b, :len(starts[b])] = starts[b]
    return ids, mask, torch.from_numpy(qp).to(device), torch.from_numpy(st).to(device)


# ------------------------------------------------------------------------------------------------
# Indexer KL (DSA-style) via hooks
# ------------------------------------------------------------------------------------------------
class IndexerTrainer:
    def __init__(self, model):
        self.model = model
        self.handles = []
        self.csa = []  # (attention module, compressor module)
        self.cap = {}
        for layer in model.model.layers:
            attn = layer.self_attn
            if isinstance(attn.compressor, mdv4.DeepseekV4CSACompressor):
                self.csa.append((attn, attn.compressor))
                i = attn.layer_idx
                self.handles.append(attn.register_forward_pre_hook(self._attn_pre(i), with_kwargs=True))
                self.handles.append(attn.compressor.register_forward_hook(self._comp_hook(i)))
                self.handles.append(attn.compressor.indexer.register_forward_pre_hook(self._idx_pre))
                self.handles.append(attn.compressor.indexer.scorer.register_forward_hook(self._scorer_hook(i)))
        self.enabled = True

    def set_topk(self, k):
        for _attn, comp in self.csa:
            comp.indexer.index_topk = k

    def _attn_pre(self, i):
        def hook(mod, args, kwargs):
            if self.enabled:
                h = args[0] if args else kwargs["hidden_states"]
                self.cap.setdefault(i, {})["h"] = h.detach()
                self.cap[i]["h_live"] = h
                self.cap[i]["pe"] = kwargs["position_embeddings"]["compress"]
                self.cap[i]["pos"] = kwargs["position_ids"]
        return hook

    def _comp_hook(self, i):
        def hook(mod, args, out):
            if self.enabled:
                self.cap.setdefault(i, {})["ckv"] = out[0].detach()
                self.cap[i]["ckv_live"] = out[0]
        return hook

    @staticmethod
    def _idx_pre(mod, args):
        # DSA: the indexer learns only from its own loss, so cut its inputs from the main graph.
        return (args[0].detach(), args[1].detach()) + tuple(args[2:])

    def _scorer_hook(self, i):
        def hook(mod, args, out):
            if self.enabled:
                self.cap.setdefault(i, {})["scores"] = out
        return hook

    def attn_sup_loss(self, qpos, starts, needle_len):
        """Attention supervision (optional, --attn-sup): at each question's key letter, the main
        attention of every CSA layer (heads averaged, over the compressed entries only, computed
        densely with gradients into the query path and the compressor) should put its mass on the
        entries that cover the asked needle. Loss: mean over questions and layers of
        -log(sum of that mass).  Entry w covers tokens 4(w-1) .. 4w+3 (spec, CSA compressor)."""
        losses = []
        valid = qpos >= 0
        if not bool(valid.any()):
            return None
        idx = qpos.clamp_min(0)
        for attn, comp in self.csa:
            c = self.cap.get(attn.layer_idx)
            if not c or "h_live" not in c or "ckv_live" not in c:
                continue
            h, (cos, sin), ckv = c["h_live"], c["pe"], c["ckv_live"]
            B, S = h.shape[0], h.shape[1]
            T = ckv.shape[2]
            if T == 0:
                continue
            rate = comp.compress_rate
            q = attn.q_b_proj(attn.q_a_norm(attn.q_a_proj(h)))
            q = q.view(B, S, -1, attn.head_dim).transpose(1, 2)
            q = attn.q_b_norm(q)
            q = mdv4.apply_rotary_pos_emb(q, cos, sin)  # [B,H,S,D]
            H, Q = q.shape[1], idx.shape[1]
            qs = torch.gather(q, 2, idx[:, None, :, None].expand(B, H, Q, q.shape[-1]))  # [B,H,Q,D]
            logits = torch.matmul(qs.float(), ckv.float().transpose(-1, -2)) * attn.scaling  # [B,H,Q,T]
            ent = torch.arange(T, device=h.device)
            visible = ent.view(1, 1, -1) < ((idx + 1) // rate).unsqueeze(-1)  # [B,Q,T]
            first = ent.view(1, 1, -1) * rate - rate  # first token an entry covers
            last = ent.view(1, 1, -1) * rate + rate - 1
            s0 = starts.unsqueeze(-1)
            target = (first <= s0 + needle_len - 1) & (last >= s0) & visible
            rows = valid & target.any(-1)
            if not bool(rows.any()):
                continue
            # log of the head-averaged mass on the targets, in log space (no underflow, so a
            # query that points away still gets a gradient): per head
            # logsumexp(targets) - logsumexp(visible), then log-mean-exp over heads.
            neg = torch.finfo(torch.float32).min
            lse_t = torch.logsumexp(logits.masked_fill(~target.unsqueeze(1), neg), dim=-1)  # [B,H,Q]
            lse_v = torch.logsumexp(logits.masked_fill(~visible.unsqueeze(1), neg), dim=-1)
            log_mass = torch.logsumexp(lse_t - lse_v, dim=1) - math.log(H)  # [B,Q]
            losses.append(-log_mass[rows].mean())
        if not losses:
            return None
        return torch.stack(losses).mean()

    def kl_loss(self, q_rows=None):
        """Mean over CSA layers of KL(p_attn || softmax(index scores)) over causally visible entries."""
        losses = []
        for attn, comp in self.csa:
            c = self.cap.get(attn.layer_idx)
            if not c or "scores" not in c:
                continue
            h, (cos, sin), pos, ckv, scores = c["h"], c["pe"], c["pos"], c["ckv"], c["scores"]
            T = ckv.shape[2]
            if T == 0:
                continue
            rate = comp.compress_rate
            with torch.no_grad():
                q = attn.q_b_proj(attn.q_a_norm(attn.q_a_proj(h)))
                q = q.view(*h.shape[:-1], -1, attn.head_dim).transpose(1, 2)
                q = attn.q_b_norm(q)
                q = mdv4.apply_rotary_pos_emb(q, cos, sin)  # [B,H,S,D]
                logits = torch.matmul(q.float(), ckv.float().transpose(-1, -2)) * attn.scaling  # [B,H,S,T]
                thr = ((pos + 1) // rate).expand(h.shape[0], -1)  # [B,S] (position_ids may be [1,S])
                ent = torch.arange(T, device=h.device)
                invalid = ent.view(1, 1, -1) >= thr.unsqueeze(-1)  # [B,S,T]
                logits = logits.masked_fill(invalid.unsqueeze(1), float("-inf"))
                rows = (~invalid).any(-1)  # [B,S]
                p = torch.softmax(logits, dim=-1).nan_to_num(0.0).sum(1)  # [B,S,T]
                p = p / p.sum(-1, keepdim=True).clamp_min(1e-20)
            s = scores.float().masked_fill(invalid, -1e30)  # finite: all-masked rows must not give NaN grads
            logq = torch.log_softmax(s, dim=-1)
            kl = (p * (torch.log(p.clamp_min(1e-20)) - logq)).masked_fill(invalid | (p == 0), 0.0).sum(-1)
            if q_rows is not None:
                rows = rows & q_rows
            losses.append(kl[rows].mean())
        self.cap = {}
        if not losses:
            return None
        return torch.stack(losses).mean()


# ------------------------------------------------------------------------------------------------
# Evaluation (transformers multi-token forward)
# ------------------------------------------------------------------------------------------------
def needle_batch(length, trials, seed, t0, t1, fmt="vk"):
    """Prompts (trial t0..t1-1) from needle_prompts.py: the same ids `sparrow needle` builds."""
    rows, aps = [], []
    for t in range(t0, t1):
        full, plen, _ans, _info = needle_prompts.make_prompt(seed, length, t, trials, fmt)
        rows.append(full)
        aps.append([plen - 1, plen, plen + 1])  # logits at these positions predict the 3 digits
    return np.array(rows, dtype=np.int64), aps


@torch.no_grad()
def evaluate(model, lengths, trials, seed, device, batch_tokens, golden=None, golden_per_length=0, fmt="vk",
             golden_lengths=None):
    """Recall@1 per length on needle_prompts.py's prompts (teacher-forced answer digits; a hit is
    all three argmaxes right, the same as greedy decoding).  `golden`: a list that receives the
    logits rows at the answer positions for the first `golden_per_length` trials of each length in
    `golden_lengths` (every length when None)."""
    was_training = model.training
    model.eval()
    table = []
    for L in lengths:
        bs = max(1, batch_tokens // L)
        hits, digit_hits = 0, 0
        for b0 in range(0, trials, bs):
            b1 = min(trials, b0 + bs)
            ids_np, aps = needle_batch(L, trials, seed, b0, b1, fmt)
            ids = torch.from_numpy(ids_np).to(device)
            logits = model(input_ids=ids, use_cache=False).logits
            for j in range(b1 - b0):
                ap = aps[j]
                rows = logits[j, ap].float()
                pred = rows.argmax(-1).cpu().numpy()
                tgt = ids_np[j, [a + 1 for a in ap]]
                ok = pred == tgt
                digit_hits += int(ok.sum())
                hits += int(ok.all())
                if golden is not None and b0 + j < golden_per_length and (golden_lengths is None or L in golden_lengths):
                    golden.append(dict(seed=seed, length=L, trial=b0 + j, trials=trials, format=fmt,
                                       ids=ids_np[j].tolist(), positions=ap,
                                       logits=rows.cpu().numpy().astype(float).round(7).tolist()))
        table.append(dict(length=L, recall=hits / trials, digit_acc=digit_hits / (3 * trials), trials=trials))
        print(f"  eval L={L}: recall@1 {hits / trials:.3f} digit acc {digit_hits / (3 * trials):.3f}", flush=True)
    if was_training:
        model.train()
    return table


def set_index_topk(model, k):
    for _n, mod in model.named_modules():
        if isinstance(mod, mdv4.DeepseekV4Indexer):
            mod.index_topk = k


# ------------------------------------------------------------------------------------------------
# Main
# ------------------------------------------------------------------------------------------------
def save_ckpt(path, model, opt, state):
    tmp = path + ".tmp"
    torch.save(dict(model=model.state_dict(), opt=opt.state_dict(), state=state), tmp)
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--train-seconds", type=float, default=900)
    ap.add_argument("--max-steps", type=int, default=10 ** 9)
    ap.add_argument("--tokens-per-step", type=int, default=24576)
    ap.add_argument("--long-tokens-per-step", type=int, default=16384, help="tokens per step at L >= 4096")
    ap.add_argument("--lengths", default="256,512,1024,2048,4096,8192")
    ap.add_argument("--heads", type=int, default=CFG["heads"])
    ap.add_argument("--head-dim", type=int, default=CFG["head_dim"],
                    help="attention head dim; q is RMS-normalised without a weight, so the largest "
                         "attention logit grows as sqrt(head_dim) (V4 uses 512)")
    ap.add_argument("--needle-format", default="vk", choices=needle_prompts.FORMATS,
                    help="vk = [ddd K] (value, then key), kvk = [K ddd K] (key on both sides)")
    ap.add_argument("--attn-sup", type=float, default=0.0,
                    help="weight of the attention supervision (IndexerTrainer.attn_sup_loss): the CSA layers' "
                         "attention at a question's key should rest on the asked needle's entries; 0 = off")
    ap.add_argument("--kv-norm-init", type=float, default=1.0,
                    help="initial value of the attention's and compressors' kv_norm weights (the indexer's stay 1): "
                         "an attention logit is at most sqrt(head_dim) times this weight's RMS")
    ap.add_argument("--needles", default="2,6",
                    help="MIN,MAX needles per training sample (each one asked); the evaluation has 4")
    ap.add_argument("--short-max-frac", type=float, default=0.5,
                    help="the short dense stage ends at this fraction of the time at the latest")
    ap.add_argument("--short-min-frac", type=float, default=0.08,
                    help="... and not before this fraction")
    ap.add_argument("--switch-recall", type=float, default=0.8,
                    help="the short dense stage ends once the quick eval at 512 (dense) reaches this recall")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--kl-weight", type=float, default=1.0)
    ap.add_argument("--eval-lengths", default="256,512,1024,2048,4096,8192")
    ap.add_argument("--eval-trials", type=int, default=64)
    ap.add_argument("--eval-seed", type=int, default=1234, help="needle_prompts seed (sparrow needle's default)")
    ap.add_argument("--eval-every", type=float, default=45, help="seconds between quick evals")
    ap.add_argument("--ckpt-every", type=float, default=120, help="seconds between resumable checkpoints")
    ap.add_argument("--resume", default="", help="a ckpt.pt written by an earlier run")
    ap.add_argument("--golden-per-length", type=int, default=2,
                    help="trials per length whose answer-position logits go to golden_hf.json")
    ap.add_argument("--golden-lengths", default="256,512,1024")
    args = ap.parse_args()

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    try:
        transformers.utils.logging.disable_progress_bar()
    except Exception:  # noqa: BLE001
        pass
    os.makedirs(args.out, exist_ok=True)
    print(f"transformers {transformers.__version__} torch {torch.__version__} device {device}", flush=True)

    # RoPE stays on 16 dims whatever the head dim (the indexer's 32-dim heads must hold them).
    cfg_dict = dict(CFG, heads=args.heads, head_dim=args.head_dim,
                    partial_rotary=CFG["partial_rotary"] * CFG["head_dim"] / args.head_dim)
    needles = tuple(int(x) for x in args.needles.split(","))
    if len(needles) != 2 or not 1 <= needles[0] <= needles[1] <= 26:
        ap.error("--needles takes MIN,MAX with 1 <= MIN <= MAX <= 26")
    cfg = build_config(cfg_dict)
    model = DeepseekV4ForCausalLM(cfg)
    init_extra(model, cfg, args.seed)
    if args.kv_norm_init != 1.0:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("kv_norm.weight") and ".indexer." not in name:
                    p.fill_(args.kv_norm_init)
    model.to(device).train()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"params {n_params / 1e6:.2f} M heads {args.heads} lr {args.lr}", flush=True)

    idx_params = [p for n, p in model.named_parameters() if ".indexer." in n]
    main_params = [p for n, p in model.named_parameters() if ".indexer." not in n]
    opt = torch.optim.AdamW([{"params": main_params, "weight_decay": 0.01},
                             {"params": idx_params, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))
    trainer = IndexerTrainer(model)
    lengths = [int(x) for x in args.lengths.split(",")]
    short = [L for L in lengths if L <= 512] or lengths[:1]
    rng = np.random.default_rng(args.seed)
    st = dict(step=0, elapsed=0.0, stage="short-dense", switched_at=None)
    if args.resume:
        ck = torch.load(args.resume, map_location=device, weights_only=False)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        st = ck["state"]
        rng = np.random.default_rng(args.seed + st["step"])
        print(f"resumed {args.resume}: {st}", flush=True)
    log = open(os.path.join(args.out, "train_log.jsonl"), "a")
    t0 = time.time() - st["elapsed"]
    last_eval = time.time()
    last_ckpt = time.time()
    ema = None
    dense_topk = 1 << 30
    applied = None
    while True:
        el = time.time() - t0
        frac = el / args.train_seconds
        if frac >= 1.0 or st["step"] >= args.max_steps:
            break
        if st["stage"] == "short-dense" and frac >= args.short_max_frac:
            st["stage"], st["switched_at"] = "all-sparse", round(el, 1)
            print(f"[{el:6.1f}s] step {st['step']}: time cap reached, stage all-sparse", flush=True)
        if applied != st["stage"]:
            trainer.set_topk(dense_topk if st["stage"] == "short-dense" else cfg.index_topk)
            applied = st["stage"]
        step = st["step"]
        # lr: linear warm-up 50 steps, cosine on time to 10%
        lr = args.lr * min(1.0, (step + 1) / 50) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))
        for g in opt.param_groups:
            g["lr"] = lr
        pool = short if st["stage"] == "short-dense" else lengths
        w = np.array([L_ ** -0.5 for L_ in pool])
        L = int(rng.choice(pool, p=w / w.sum()))
        B = max(1, (args.long_tokens_per_step if L >= 4096 else args.tokens_per_step) // L)
        sup_on = args.attn_sup > 0
        batch_ = make_batch(rng, B, L, device, args.needle_format, needles, with_questions=sup_on)
        ids, amask = batch_[0], batch_[1]
        out = model(input_ids=ids, use_cache=False, output_router_logits=True)
        logits = out.logits[:, :-1].float()
        tgt = ids[:, 1:]
        m = amask[:, :-1]
        ce = F.cross_entropy(logits.reshape(-1, VOCAB), tgt.reshape(-1), reduction="none").view_as(m)
        ce = (ce * m).sum() / m.sum()
        with torch.no_grad():
            acc = ((logits.argmax(-1) == tgt).float() * m).sum() / m.sum()
        sup = trainer.attn_sup_loss(batch_[2], batch_[3], NEEDLE_LEN + (args.needle_format == "kvk")) if sup_on else None
        kl = trainer.kl_loss()
        aux = out.aux_loss if out.aux_loss is not None else torch.zeros((), device=device)
        loss = ce + 0.01 * aux + (args.kl_weight * kl if kl is not None else 0.0)
        if sup is not None:
            loss = loss + args.attn_sup * sup
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        st["step"] += 1
        step = st["step"]
        st["elapsed"] = time.time() - t0
        rec = dict(step=step, t=round(st["elapsed"], 2), phase=st["stage"], L=L, B=B, lr=lr, ce=float(ce.detach()),
                   acc=float(acc), kl=None if kl is None else float(kl), aux=float(aux), gnorm=float(gn),
                   sup=None if sup is None else float(sup))
        log.write(json.dumps(rec) + "\n")
        ema = float(ce) if ema is None else 0.95 * ema + 0.05 * float(ce)
        if step % 50 == 0 or step <= 3:
            print(f"[{rec['t']:6.1f}s] step {step} {st['stage']} L={L} B={B} ce {float(ce):.3f} (ema {ema:.3f}) "
                  f"acc {float(acc):.3f} kl {rec['kl'] if kl is None else round(float(kl), 4)} "
                  f"aux {float(aux):.3f} sup {rec['sup'] if sup is None else round(float(sup), 3)} lr {lr:.2e} mem {torch.cuda.max_memory_allocated() / 2**30 if device.type == 'cuda' else 0:.1f}G", flush=True)
        if time.time() - last_eval > args.eval_every:
            trainer.enabled = False
            if st["stage"] == "short-dense":
                tab = evaluate(model, [512], 32, 999, device, 65536, fmt=args.needle_format)
                if tab[0]["recall"] >= args.switch_recall and frac >= args.short_min_frac:
                    st["stage"], st["switched_at"] = "all-sparse", round(st["elapsed"], 1)
                    print(f"[{st['elapsed']:6.1f}s] step {step}: recall {tab[0]['recall']:.2f} at 512, "
                          f"stage all-sparse", flush=True)
            else:
                tab = evaluate(model, [512, 2048, 8192], 16, 999, device, 65536, fmt=args.needle_format)
            trainer.enabled = True
            log.write(json.dumps(dict(step=step, t=round(st["elapsed"], 2), stage=st["stage"], quick_eval=tab)) + "\n")
            log.flush()
            last_eval = time.time()
        if time.time() - last_ckpt > args.ckpt_every:
            save_ckpt(os.path.join(args.out, "ckpt.pt"), model, opt, st)
            last_ckpt = time.time()
    log.flush()
    train_time = time.time() - t0
    print(f"trained {st['step']} steps in {train_time:.1f}s (stage switch at {st['switched_at']} s)", flush=True)
    save_ckpt(os.path.join(args.out, "ckpt.pt"), model, opt, st)

    # ---- save (bf16) --------------------------------------------------------------------------------
    trainer.set_topk(cfg.index_topk)
    for h in trainer.handles:
        h.remove()
    model.eval()
    ckpt = os.path.join(args.out, "needle-tiny")
    model.cpu().to(torch.bfloat16).save_pretrained(ckpt, safe_serialization=True)
    for f in os.listdir(ckpt):
        if f not in ("config.json", "model.safetensors", "generation_config.json"):
            os.remove(os.path.join(ckpt, f))
    with open(os.path.join(ckpt, "tokenizer_desc.json"), "w") as fh:
        json.dump(TOKENIZER_DESC, fh, indent=1)

    # ---- reload (bf16 weights, float32 compute) + evaluate (multi-token forward, TF32 off) ----------
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    loaded = DeepseekV4ForCausalLM.from_pretrained(ckpt, dtype=torch.float32).to(device).eval()
    fresh = DeepseekV4ForCausalLM(build_config(cfg_dict)).to(device)
    ref_bufs = dict(fresh.named_buffers())
    with torch.no_grad():
        for name, buf in loaded.named_buffers():
            if "inv_freq" in name and not torch.equal(buf, ref_bufs[name].to(buf.dtype)):
                print(f"restoring rotary buffer {name} (rounded by the bf16 load)", flush=True)
                buf.copy_(ref_bufs[name])
    del fresh
    eval_lengths = [int(x) for x in args.eval_lengths.split(",")]
    golden_lengths = {int(x) for x in args.golden_lengths.split(",")}
    missing = golden_lengths - set(eval_lengths)
    if missing:
        print(f"golden lengths {sorted(missing)} are not among --eval-lengths: no golden logits for them", flush=True)
    golden = []
    # One pass gives the recall table and the golden logits rows.
    table = evaluate(loaded, eval_lengths, args.eval_trials, args.eval_seed, device, 65536, golden=golden,
                     golden_per_length=args.golden_per_length, fmt=args.needle_format, golden_lengths=golden_lengths)
    with open(os.path.join(args.out, "golden_hf.json"), "w") as fh:
        json.dump(dict(note="transformers %s float32 multi-token forward, TF32 off; logits rows at the 3 answer "
                            "positions of needle_prompts.py prompts" % transformers.__version__,
                       index_topk=cfg.index_topk, cases=golden), fh)
    set_index_topk(loaded, 1 << 30)
    dense_tab = evaluate(loaded, eval_lengths, args.eval_trials, args.eval_seed, device, 65536, fmt=args.needle_format)
    summary = dict(steps=st["step"], train_seconds=round(train_time, 1), stage_switch_s=st["switched_at"],
                   params=n_params, config=cfg_dict, args=vars(args), recall=table, recall_dense_csa=dense_tab,
                   versions=dict(transformers=transformers.__version__, torch=torch.__version__))
    with open(os.path.join(args.out, "summary.json"), "w") as fh:
        json.dump(summary, fh, indent=1)
    print(json.dumps(dict(recall=table, recall_dense_csa=dense_tab)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
