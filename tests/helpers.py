"""Tiny models and readers shared by the tests (tests import these, never each other).

Everything here is seconds to build on CPU: a 1-layer, 32-wide GPT-2, a 16-wide planner and a planned LM
whose adapter is already "trained-looking" (its plan vectors move the logits)."""

from __future__ import annotations

import contextlib
import csv
from pathlib import Path

import torch

from planlm.data.artifacts import PreparedDataset
from planlm.data.resources import load_tokenizer
from planlm.models.planned_lm import PlannedLM, PlannedLMConfig
from planlm.models.planner import Planner, PlannerConfig
from planlm.plans.config import PlanConfig


def tiny_gpt2_config(**overrides) -> dict:
    """The `model_config` of a 1-layer, 32-wide GPT-2 (what `train-lm --model.model_config` takes)."""
    return {"model_type": "gpt2", "n_layer": 1, "n_embd": 32, "n_head": 2, "n_positions": 128, **overrides}


def tiny_gpt2(seed: int = 0, n_positions: int = 128):
    """A random GPT-2 of `tiny_gpt2_config` with the real GPT-2 vocabulary (the prepared corpora's tokenizer)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = {k: v for k, v in tiny_gpt2_config(n_positions=n_positions).items() if k != "model_type"}
    return GPT2LMHeadModel(GPT2Config(**config, vocab_size=50257)).eval()


def tiny_planner(prepared: PreparedDataset, seed: int = 0, **overrides) -> Planner:
    """A random planner over the prepared corpus's actions (16 wide, horizon 3), in eval mode, that records
    which corpus it belongs to (as `train-planner` does), so its folder passes the codebook checks."""
    torch.manual_seed(seed)
    config = PlannerConfig(**{"num_actions": prepared.num_actions, "embedding_dim": prepared.embedding_dim,
                              "d_model": 16, "num_heads": 2, "dim_feedforward": 32, "horizon": 3, **overrides})
    planner = Planner(config, codebook=prepared.codebook)
    planner.prepared_info = {"num_actions": prepared.num_actions, "embedding_dim": prepared.embedding_dim,
                             "codebook_hash": prepared.codebook_hash, "encoder": prepared.encoder_name}
    return planner.eval()


def tiny_planned_lm(prepared: PreparedDataset, adapter: str = "project_avg", seed: int = 0) -> PlannedLM:
    """`tiny_gpt2` with an oracle-conditioned adapter (K=2, T=3) whose projection is randomised, so that
    plan vectors really move the logits."""
    from planlm.models.adapter import AdapterConfig

    adapter_config = AdapterConfig(kind=adapter, num_actions=prepared.num_actions, action_dim=prepared.embedding_dim,
                                   hidden_size=32, horizon=4, num_heads=2)
    config = PlannedLMConfig(plans=PlanConfig(kind="oracle", num_paths=2, horizon=3), adapter=adapter_config,
                             num_actions=prepared.num_actions, codebook_hash=prepared.codebook_hash,
                             tokenizer=prepared.tokenizer_name, base_model_config={"model_type": "gpt2"})
    model = PlannedLM(config, tiny_gpt2(seed), prepared.codebook)
    torch.manual_seed(seed + 1)
    with torch.no_grad():  # a trained-looking adapter: plan vectors that really move the logits
        model.adapter.projection.weight.normal_(std=0.5)
    return model.eval()


def use_planner(model: PlannedLM, planner_dir) -> PlannedLM:
    """``model`` as if trained on plans sampled from the planner in ``planner_dir`` (its K and T kept)."""
    model.config.plans = {**model.config.plans, "kind": "planner_sampled"}
    model.plan_folders = {"planner_dir": str(planner_dir)}
    return model


CHATTY_WORDS = (" red", " water", ".")


def sampled_multipath(prepared: PreparedDataset, planner_dir: Path):
    """A tiny multipath planned LM with both ReZero scalars at 1 (its path and sample transformers on)
    and the plans of 2 sampled paths of 3 steps from a tiny planner saved in ``planner_dir``."""
    
    tiny_planner(prepared).save_pretrained(planner_dir)
    model = tiny_planned_lm(prepared, adapter="multipath")
    with torch.no_grad():
        model.adapter.alpha_path.fill_(1.0)
        model.adapter.alpha_sample.fill_(1.0)
    return model, PlanConfig(kind="planner_sampled", num_paths=2, horizon=3, planner_dir=str(planner_dir)).resolve()


def chatty_planned_lm(prepared: PreparedDataset, period_bias: float = 0.66, seed: int = 0,
                      adapter: str = "project_avg") -> PlannedLM:
    """A tiny planned LM that mostly writes " red", " water" and "." (so sentences end), still
    depending (weakly) on its input and its plans: the final layer norm keeps 30% of its gain. A multipath
    adapter has both ReZero scalars at 1."""
    model = tiny_planned_lm(prepared, adapter=adapter, seed=seed)
    if adapter == "multipath":
        with torch.no_grad():
            model.adapter.alpha_path.fill_(1.0)
            model.adapter.alpha_sample.fill_(1.0)
    tok = load_tokenizer("gpt2")
    ids = [tok.encode(w)[0] for w in CHATTY_WORDS]
    direction = torch.zeros(32)
    direction[0] = 1.0
    with torch.no_grad():
        model.lm.transformer.ln_f.weight.mul_(0.3)
        model.lm.transformer.ln_f.bias.copy_(20 * direction)
        wte = model.lm.transformer.wte.weight  # tied with the output projection
        wte[ids[0]] += 0.7 * direction
        wte[ids[1]] += 0.7 * direction
        wte[ids[2]] += period_bias * direction
    return model


@contextlib.contextmanager
def linear_output_dtypes():
    """Records the output dtype of every ``nn.Linear`` call made inside the block, whichever network it
    belongs to (the LM head, the adapter's projection and transformers, the planner's layers, also those of
    models loaded from folders inside the block) -> {module: set of dtypes}."""
    seen: dict = {}

    def record(module, args, output):
        if isinstance(module, torch.nn.Linear) and isinstance(output, torch.Tensor):
            seen.setdefault(module, set()).add(output.dtype)

    handle = torch.nn.modules.module.register_module_forward_hook(record)
    try:
        yield seen
    finally:
        handle.remove()


def read_csv(path: str | Path) -> list[dict]:
    """The rows of a CSV file with a header (per_article.csv, per_boundary.csv, sweep tables, metrics.csv)."""
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def tiny_run_config(out_dir: Path, **overrides) -> dict:
    """A `planlm run` config with every stage at tiny sizes (about a minute on 2 CPU cores)."""
    config = {
        "out_dir": str(out_dir),
        "prepare": {"corpus": {"source": "wiki-offline", "num_train": 40, "num_validation": 6, "num_test": 6},
                    "actions": {"num_actions": 8}, "tokenizer": "gpt2"},
        "planner": {"model": {"d_model": 32, "num_heads": 2, "dim_feedforward": 64, "horizon": 3},
                    "train": {"batch_size": 64, "lr": 0.003, "max_epochs": 2}},
        "lm": {"model": {"model_config": tiny_gpt2_config(n_positions=64)},
               "train": {"context_length": 64, "stride": 63, "batch_size": 8, "lr": 0.003, "max_steps": 6}},
        "conditions": [
            {"name": "none", "plans": {"kind": "none"}},
            {"name": "fixed", "paper": "Fixed", "plans": {"kind": "fixed"}},
            {"name": "cornille", "paper": "Cornille et al. (T=1, K=1)",
             "plans": {"kind": "planner_argmax", "num_paths": 1, "horizon": 1}},
            {"name": "ours", "plans": {"kind": "planner_sampled", "num_paths": 3, "horizon": 3},
             "adapter": {"kind": "multipath"}},
            {"name": "oracle", "plans": {"kind": "oracle"}},
        ],
        "evaluate": {"stride": 32, "context_length": 64, "batch_size": 32, "bootstrap_samples": 200},
        "edit_distance": {"max_articles": 2, "max_boundaries_per_article": 1, "sampling": {"max_new_tokens": 12},
                          "context_length": 64,
                          "bootstrap_samples": 200},
        "sweeps": [{"condition": "ours", "kind": "num_paths", "num_paths": [1, 3], "stride": 32, "context_length": 64,
                    "bootstrap_samples": 200},
                   {"condition": "ours", "kind": "compute", "num_paths": [1, 3], "policies": [{"kind": "entropy"}],
                    "max_articles": 3, "stride": 32, "context_length": 64, "bootstrap_samples": 200}],
        "report": {"actions_shown": 3},
    }
    config.update(overrides)
    return config


def write_tiny_llama_gguf(path: Path, seed: int = 0, architecture: str = "llama", other_vocab: bool = False):
    """A 1-layer, 32-wide random Llama with the GPT-2 tokenizer written as an F32 GGUF file, the way
    llama.cpp's converter lays it out (q/k rows permuted, tensor names blk.N.*), so that it loads through
    transformers' GGUF reader like the real SmolLM2 file. ``other_vocab`` renames one token (a tokenizer
    that differs from GPT-2's); ``architecture`` sets general.architecture. Returns the HF model written."""
    import json

    import gguf
    import numpy as np
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = load_tokenizer("gpt2")
    heads, kv_heads, width = 2, 1, 32
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=width, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=128,
                         tie_word_embeddings=False)
    lm = LlamaForCausalLM(config)

    def permute(w: torch.Tensor, n_head: int) -> torch.Tensor:  # llama.cpp's rotary layout of q / k rows
        return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    names = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
    layer = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name("tiny-llama")
    writer.add_context_length(128)
    writer.add_embedding_length(width)
    writer.add_block_count(1)
    writer.add_feed_forward_length(64)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(width // heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(len(tokenizer))
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([token for token, _ in vocab[:-1]] + ["<|other|>" if other_vocab else vocab[-1][0]])
    writer.add_token_types([1] * len(vocab))
    merges = json.loads(tokenizer.backend_tokenizer.to_str())["model"]["merges"]
    writer.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in merges])
    writer.add_bos_token_id(tokenizer.bos_token_id)
    writer.add_eos_token_id(tokenizer.eos_token_id)
    for name, weight in lm.state_dict().items():
        prefix, kind = name.rsplit(".", 1)
        if prefix.startswith("model.layers."):
            index, part = prefix[len("model.layers."):].split(".", 1)
            gguf_name = f"blk.{index}.{layer[part]}.{kind}"
        else:
            gguf_name = f"{names[prefix]}.{kind}"
        if gguf_name.endswith(("attn_q.weight", "attn_k.weight")):
            weight = permute(weight, heads if "attn_q" in gguf_name else kv_heads)
        writer.add_tensor(gguf_name, weight.detach().float().numpy().astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return lm.eval()


def report_target(report: str, name: str) -> bool:
    """Whether the report's target line that starts with ``name`` says PASS (fails when it is missing)."""
    lines = [line for line in report.splitlines() if line.startswith(("- PASS: ", "- FAIL: ")) and
             line[8:].startswith(name)]
    assert len(lines) == 1, report
    return lines[0].startswith("- PASS")


def seeded_contrast(b: str, a: str, diffs: list[float], low: float, high: float) -> dict:
    """A contrast of a run's results.json (``planlm compare``'s fields) with one difference per seed 0, 1, ..."""
    return {"b": b, "a": a, "diff": sum(diffs) / len(diffs), "ci_low": low, "ci_high": high,
            "seed_diffs": {str(seed): diff for seed, diff in enumerate(diffs)}}


def greedy_path(planner: Planner, context_embeds: torch.Tensor, context_mask: torch.Tensor,
                horizon: int) -> torch.Tensor:
    """The planner's greedy path, rolled out in eval mode (the argmax path the plan kinds draw) -> (B, T)."""
    was_training = planner.training
    planner.eval()
    try:
        with torch.no_grad():
            return planner.rollout(context_embeds, context_mask, horizon)[1]
    finally:
        planner.train(was_training)
