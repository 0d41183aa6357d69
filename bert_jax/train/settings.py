"""A checkpoint's own settings that shape no tensor, against the run's. A warm start or a
resume with another activation, LayerNorm epsilon or tokenizer casing loads every tensor
(the shapes match) and trains the weights under settings they were not trained with, without
a word; `check` stops such a run before its first step with one line naming each setting and
both values, unless `config.train.accept_setting_changes` says the change is meant.

    check(saved, wanted, what, accept)     # {setting: value} each; None: not known
    model_settings(bert_config)            # the BertConfig fields below
    run_settings(config_dict, model=...)   # a saved run's, from its config
    check_resume(task_settings, workdir, accept)   # the loop, resuming WORKDIR
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from bert_jax.convert.sources import open_run, run_casing
from bert_jax.models.config import ConfigError

# BertConfig fields that change what the weights compute, not their shapes (the position
# embedding kind, the sizes and the layer layout are architecture: warm_start.ARCH_KEYS).
MODEL_SETTINGS = ("hidden_act", "layer_norm_eps", "pre_ln", "rope_theta", "local_rope_theta",
                  "global_attn_every_n_layers", "local_attention")
CASING = "do_lower_case"   # the tokenizer's: lowercased (and accents stripped) or cased


class SettingsChangedError(ConfigError):
    """A warm start or resume with settings other than the checkpoint's own."""


def model_settings(bert_config) -> dict[str, Any]:
    return {k: getattr(bert_config, k, None) for k in MODEL_SETTINGS}


def run_settings(config: Mapping, model: bool = True) -> dict[str, Any]:
    """A run config's settings (a saved run's dict, or a ConfigDict): its `model` section's
    (`model`: when the run's model is that section, pre-training) and the casing its text
    is tokenized with (fine-tuning's tokenizer section; pre-training's data section when it
    names a vocabulary)."""
    out: dict[str, Any] = {CASING: run_casing(config)}
    if model:
        section = config.get("model") or {}
        out.update({k: section.get(k) for k in MODEL_SETTINGS})
    return out


def _key(name: str, where: Mapping[str, str]) -> str:
    return where.get(name, f"model.{name}")


def check(saved: Mapping[str, Any], wanted: Mapping[str, Any], what: str,
          accept: bool, keys: Optional[Mapping[str, str]] = None) -> list[str]:
    """The settings known on both sides that differ, as "name: saved -> wanted"; a
    SettingsChangedError naming them all unless `accept`. `keys`: the config key of each
    setting in the message (default model.<name>)."""
    keys = keys or {}
    differ = [k for k in wanted if saved.get(k) is not None and wanted[k] is not None
              and saved[k] != wanted[k]]
    shown = [f"{k} is {saved[k]!r} there, {wanted[k]!r} in the config ({_key(k, keys)})"
             for k in differ]
    if differ and not accept:
        raise SettingsChangedError(
            f"{what}: settings that shape no tensor differ from the checkpoint's own, which "
            f"its weights were trained with: {'; '.join(shown)}; set them as the "
            f"checkpoint's, or pass --config.train.accept_setting_changes=True to train with "
            f"the config's")
    return [f"{k}: {saved[k]!r} -> {wanted[k]!r}" for k in differ]


def check_resume(wanted: Mapping[str, Any], workdir: str, accept: bool) -> list[str]:
    """WORKDIR's latest checkpoint's settings (its saved config) against the run's
    (`wanted`: the task's `settings`): `check`, before anything is built. A fine-tuning
    run's model is its init checkpoint's, which check(config) checks: its task's settings
    are its casing alone. Returns the changes accepted."""
    try:
        saved = open_run(workdir, "WORKDIR").config
    except Exception:  # noqa: BLE001  (a damaged latest step: the restore skips and names it)
        return []
    finetuning = "task" in saved
    return check(run_settings(saved, model=not finetuning), wanted, f"{workdir}: resuming",
                 accept, keys={CASING: "tokenizer.do_lower_case" if finetuning
                               else "data.do_lower_case"})
