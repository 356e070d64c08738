"""TGI (text-generation-inference): ``text-generation-launcher --model-id FOLDER --max-total-tokens N`` (not
launched here; TGI is in maintenance mode since December 2025, huggingface/text-generation-inference#3345).

Read from TGI's source: the launcher's ``--rope-scaling {linear,dynamic}`` and ``--rope-factor`` reach the server
as ``ROPE_SCALING`` / ``ROPE_FACTOR`` and replace config.json's scaling (``_get_rope_config``,
``server/text_generation_server/layers/rotary.py``); from config.json it reads ``rope_theta`` and ``rope_scaling``
through transformers 4 (the keys hf_posenc writes beside ``rope_parameters``, :mod:`hf_posenc.checkpoints.legacy_rope`):
``PositionRotaryEmbedding.static`` applies no factor for linear, computes dynamic, yarn (attn_factor 1, betas
32 / 1 and truncation fixed) and llama3 as transformers does, and longrope with the short factors below the
original context and the long ones past it within one input;
``--max-total-tokens`` defaults to ``max_position_embeddings`` and is not multiplied by a factor.
"""

from __future__ import annotations

from ..registry import Engine, register_engine
from .base import CANNOT, NOT_MEASURED, UINT32_MAX, Launch, Most, Served, length_for, not_native

ENGINE = "TGI"
CHECKED = ("not launched here: read from TGI's launcher/src/main.rs (--rope-scaling, --rope-factor) and "
           "server/text_generation_server/layers/rotary.py")
MOST = Most(UINT32_MAX, "TGI's launcher takes the batch budgets one request must fit in, "
            "--max-batch-prefill-tokens and --max-batch-total-tokens, as u32")
FLAGGED = {"dynamic": "dynamic"}  # rope types the launcher's flags express and its server computes


def _differs(rope: dict) -> str | None:
    """Why TGI's ``PositionRotaryEmbedding.static`` computes another RoPE from config.json's transformers-4 keys
    than transformers does from ``rope_parameters`` (None: the same formulas)."""
    rope_type = rope.get("rope_type", "default")
    if rope_type == "linear":
        return "its PositionRotaryEmbedding.static reads rope_type 'linear' and applies no factor"
    if rope_type == "yarn":
        fixed = {"beta_fast": 32, "beta_slow": 1}
        other = [f"{k} {rope[k]:g}" for k, v in fixed.items() if rope.get(k) not in (None, v)]
        if rope.get("attention_factor") is not None:
            other.append(f"attention_factor {rope['attention_factor']:g}")
        mscale, all_dim = rope.get("mscale"), rope.get("mscale_all_dim")
        if not (mscale and all_dim) and (mscale not in (None, 1) or all_dim not in (None, 0)):
            other.append("mscale or mscale_all_dim alone")
        if rope.get("truncate") is False:
            other.append("truncate false")
        if other:
            return f"its YaRN fixes beta_fast 32, beta_slow 1, attn_factor 1 and truncation; this one has " \
                   f"{', '.join(other)}"
    if rope_type == "longrope":
        return ("its longrope uses the short factors for the first original_max_position_embeddings positions and "
                "the long ones past them within one input, where transformers uses the long factors for every "
                "position of a longer input, and takes its attention factor from the context ratio alone")
    if rope_type not in ("default", "dynamic", "yarn", "llama3"):
        return f"it has no rope_type {rope_type!r}"
    return None


def _from_legacy(served: Served, length: int | None) -> Launch:
    """A folder whose config.json carries the transformers-4 keys TGI's server reads."""
    rope = served.rope
    rope_type = rope.get("rope_type", "default")
    why = _differs(rope)
    if why:
        return Launch(ENGINE, CANNOT, f"TGI reads config.json's rope_theta and rope_scaling (rope_type "
                                      f"{rope_type!r}), but {why}.", checked=CHECKED)
    n = length_for(served, length, ENGINE, served.context, most=MOST)
    command = ["text-generation-launcher", "--model-id", served.path, "--max-input-tokens", str(n - 1),
               "--max-total-tokens", str(n)]
    notes = ["TGI is in maintenance mode since December 2025 (its README points to vLLM, SGLang and llama.cpp)"]
    if rope_type == "dynamic":
        notes.append("TGI's dynamic NTK follows the longest input it has seen, not each input's length")
    return Launch(ENGINE, NOT_MEASURED, f"TGI reads rope_type {rope_type!r} and rope_theta "
                                        f"{float(rope['rope_theta']):g} "
                                        "from config.json's rope_scaling and rope_theta, which state the same RoPE "
                                        "as its rope_parameters; not measured here.", command=command,
                  max_length=n, checked=CHECKED, notes=notes)


def launch(served: Served, length: int | None) -> Launch:
    if served.gguf:
        return Launch(ENGINE, CANNOT, "TGI does not serve GGUF files: serve the folder 'hf-posenc patch --output' "
                                      "writes.", checked=CHECKED)
    if not served.native:
        return not_native(served, ENGINE, f"TGI loads the folder as the unpatched model, up to the original context "
                                          f"({served.original})")
    if served.legacy is not None:
        return _from_legacy(served, length)
    rope = served.rope
    rope_type = rope.get("rope_type", "default")
    theta = float(rope.get("rope_theta", 10000.0))
    if theta != 10000.0 or rope_type not in ("default", *FLAGGED):
        return Launch(ENGINE, CANNOT, "TGI's server reads config.rope_theta and config.rope_scaling; under "
                                      "transformers 4 (TGI's releases) this config.json, written by transformers 5 "
                                      "with both inside rope_parameters alone, gives base 10000 and no scaling, and "
                                      "its launcher's flags "
                                      f"express only dynamic scaling: not this model (rope_type {rope_type!r}, "
                                      f"rope_theta {theta:g}). 'hf-posenc upgrade-config FOLDER' adds the "
                                      "transformers-4 keys where they state the same RoPE.", checked=CHECKED)
    # TGI's max_total_tokens: at most max_position_embeddings
    n = length_for(served, length, ENGINE, served.context, most=MOST)
    command = ["text-generation-launcher", "--model-id", served.path, "--max-input-tokens", str(n - 1),
               "--max-total-tokens", str(n)]
    notes = ["TGI is in maintenance mode since December 2025 (its README points to vLLM, SGLang and llama.cpp)"]
    if rope_type in FLAGGED:
        command += ["--rope-scaling", FLAGGED[rope_type], "--rope-factor", f"{float(rope['factor']):g}"]
        notes.append("--rope-scaling / --rope-factor repeat config.json's scaling, which TGI on transformers 4 would "
                     "not read from rope_parameters (they replace config.json's scaling)")
        notes.append("TGI's dynamic NTK follows the longest input it has seen, not each input's length")
    return Launch(ENGINE, NOT_MEASURED, f"TGI reads rope_type {rope_type!r}; not measured here.", command=command,
                  max_length=n, checked=CHECKED, notes=notes)


register_engine(Engine("tgi", ENGINE, launch=launch))
