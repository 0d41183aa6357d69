"""Makes the ModernBERT goldens with an independent implementation: Hugging Face
transformers' PyTorch ModernBertForMaskedLM, randomly initialised at tiny shapes (global and
sliding-window layers, a padded batch, lengths past the window), float32.

Run from the repo root where torch and transformers are installed (the test suite only
reads the file written here):

    python tests/goldens/make_modernbert_goldens.py

Writes tests/goldens/modernbert_tiny.npz: config (config.json text), state/<name> (the
state dict, without the tied decoder weight), input_ids, attention_mask,
last_hidden_state (ModernBertModel's output) and logits (the MLM head's, every position).
"""

import os

import numpy as np
import torch
import transformers

HERE = os.path.dirname(os.path.abspath(__file__))


def modernbert_tiny():
    torch.manual_seed(0)
    cfg = transformers.ModernBertConfig(
        vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
        num_attention_heads=4, global_attn_every_n_layers=3, local_attention=8,
        max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        cls_token_id=1, sep_token_id=2, global_rope_theta=160_000.0, local_rope_theta=10_000.0,
        attn_implementation="eager")
    model = transformers.ModernBertForMaskedLM(cfg).eval()
    assert [layer.attention_type for layer in model.model.layers] == [
        "full_attention", "sliding_attention", "sliding_attention", "full_attention"]
    # Non-trivial LayerNorm scales and decoder bias, so that a wrong mapping cannot hide.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name == "decoder.bias":
                p.add_(0.1 * torch.randn_like(p))
    rng = np.random.default_rng(0)
    batch, length = 3, 40
    lengths = [40, 31, 24]  # all longer than the window (local_attention // 2 = 4)
    input_ids = rng.integers(3, cfg.vocab_size, size=(batch, length))
    attention_mask = np.zeros((batch, length), np.int64)
    for i, n in enumerate(lengths):
        input_ids[i, 0] = 1
        input_ids[i, n - 1] = 2
        input_ids[i, n:] = 0
        attention_mask[i, :n] = 1
    with torch.no_grad():
        ids, mask = torch.tensor(input_ids), torch.tensor(attention_mask)
        hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state
        logits = model(input_ids=ids, attention_mask=mask).logits
    state = {k: v.numpy() for k, v in model.state_dict().items() if k != "decoder.weight"}
    np.savez_compressed(
        os.path.join(HERE, "modernbert_tiny.npz"),
        config=np.array(cfg.to_json_string()),
        **{"state/" + k: v for k, v in state.items()},
        input_ids=input_ids.astype(np.int32), attention_mask=attention_mask.astype(np.int32),
        last_hidden_state=hidden.numpy(), logits=logits.numpy())


if __name__ == "__main__":
    modernbert_tiny()
    print("wrote", os.path.join(HERE, "modernbert_tiny.npz"))
