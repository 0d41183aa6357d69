"""The PyTorch reference step the benchmarks compare bert_jax's against: Hugging Face
transformers' BertForPreTraining (MLM + NSP, dropout on, SDPA attention), AdamW with weight
decay off biases and LayerNorms (as bert_jax's optimizer), gradients clipped to the config's
norm, optionally under torch.autocast and torch.compile. gpu_suite's torch child and
anchor_torch.py both build it here. Not a script; needs `torch` and `transformers`."""

from __future__ import annotations

import contextlib


def hf_config(model=None):
    """transformers.BertConfig of a bert_jax config's `model` section (a mapping with the
    BertConfig field names), or BERT-Base's defaults when `model` is None; SDPA attention."""
    from transformers import BertConfig

    if model is None:
        return BertConfig(attn_implementation="sdpa")
    get = model.get
    return BertConfig(
        vocab_size=model["vocab_size"], hidden_size=model["hidden_size"],
        num_hidden_layers=model["num_hidden_layers"],
        num_attention_heads=model["num_attention_heads"],
        intermediate_size=model["intermediate_size"], hidden_act=get("hidden_act", "gelu"),
        hidden_dropout_prob=get("hidden_dropout_prob", 0.1),
        attention_probs_dropout_prob=get("attention_probs_dropout_prob", 0.1),
        max_position_embeddings=model["max_position_embeddings"],
        type_vocab_size=get("type_vocab_size", 2), layer_norm_eps=get("layer_norm_eps", 1e-12),
        initializer_range=get("initializer_range", 0.02), attn_implementation="sdpa")


def adamw(model, optimizer=None, *, fused: bool = False):
    """torch.optim.AdamW over `model`'s parameters with the betas / eps / weight decay of a
    bert_jax `optimizer` section (its defaults when None), no decay on biases and LayerNorm
    weights; lr 1e-4 (a constant: the step's cost does not depend on it)."""
    import torch

    opt = optimizer or {}
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if p.ndim < 2 or "LayerNorm" in name else decay).append(p)
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": float(opt.get("weight_decay", 0.01))},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=1e-4, betas=(float(opt.get("b1", 0.9)), float(opt.get("b2", 0.999))),
        eps=float(opt.get("eps", 1e-6)), fused=fused)


class Reference:
    """One training step of HF BertForPreTraining: `step(batch)` runs forward (under
    autocast when `autocast` is a dtype), backward, clipping to `clip_norm` and the AdamW
    update, and returns the loss tensor (not synchronised)."""

    def __init__(self, model=None, optimizer=None, *, device: str = "cpu", autocast=None,
                 fused: bool = False, compile: bool = False, seed: int = 0):
        import torch
        from transformers import BertForPreTraining

        torch.manual_seed(seed)
        self.model = BertForPreTraining(hf_config(model)).to(device).train()
        self.optimizer = adamw(self.model, optimizer, fused=fused)
        self.clip_norm = float((optimizer or {}).get("clip_norm", 1.0))
        self.device, self.autocast, self.fused = device, autocast, fused
        self.forward = torch.compile(self.model) if compile else self.model
        self.params = [p for p in self.model.parameters() if p.requires_grad]

    def n_params(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def step(self, batch: dict):
        import torch

        self.optimizer.zero_grad(set_to_none=True)
        cast = (torch.autocast(device_type=self.device, dtype=self.autocast)
                if self.autocast is not None else contextlib.nullcontext())
        with cast:
            loss = self.forward(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, self.clip_norm)
        self.optimizer.step()
        return loss


def synthetic_batches(batch: int, seq: int, preds: int, vocab_size: int, *,
                      device: str = "cpu", count: int = 2, seed: int = 0) -> list:
    """`count` full-length batches laid out as bert_jax.data.synthetic's: [CLS] A [SEP] B
    [SEP] of random word ids, `preds` masked positions per row (labels -100 elsewhere, as HF
    expects), a random next-sentence label."""
    import torch

    g = torch.Generator().manual_seed(seed)
    b, s, p = batch, seq, preds
    out = []
    for _ in range(count):
        ids = torch.randint(104, vocab_size, (b, s), generator=g)
        mid = max(1, s // 2)
        ids[:, 0], ids[:, mid], ids[:, -1] = 101, 102, 102
        keys = torch.rand((b, s), generator=g)
        keys[:, [0, mid, s - 1]] = 2.0  # never mask [CLS] / [SEP]
        pos = keys.argsort(dim=1)[:, :p]
        labels = torch.full((b, s), -100, dtype=torch.long)
        labels.scatter_(1, pos, ids.gather(1, pos))
        ids.scatter_(1, pos, 103)
        segment = torch.zeros((b, s), dtype=torch.long)
        segment[:, mid + 1:] = 1
        one = dict(input_ids=ids, attention_mask=torch.ones((b, s), dtype=torch.long),
                   token_type_ids=segment, labels=labels,
                   next_sentence_label=torch.randint(0, 2, (b,), generator=g))
        out.append({k: v.to(device) for k, v in one.items()})
    return out

