"""TGI (text-generation-inference): ``text-generation-launcher --model-id FOLDER --max-total-tokens N`` (not
launched here; TGI is in maintenance mode since December 2025, huggingface/text-generation-inference#3345).

Read from TGI's source: the launcher's ``--rope-scaling {linear,dynamic}`` and ``--rope-factor`` reach the server
as ``ROPE_SCALING`` / ``ROPE_FACTOR`` and replace config.json's scaling (``_get_rope_config``,
``server/text_generation_server/layers/rotary.py``); from config.json it reads ``rope_scaling`` of type linear,
dynamic, yarn (attn_factor 1, betas 32 / 1 fixed), llama3 and longrope, through transformers 4's spelling;
``--max-total-tokens`` defaults to ``max_position_embeddings`` and is not multiplied by a factor.
"""

from __future__ import annotations

from .base import CANNOT, NOT_MEASURED, UINT32_MAX, Launch, Most, Served, length_for, not_native
from ..registry import Engine, register_engine

ENGINE = "TGI"
CHECKED = ("not launched here: read from TGI's launcher/src/main.rs (--rope-scaling, --rope-factor) and "
           "server/text_generation_server/layers/rotary.py")
MOST = Most(UINT32_MAX, "TGI's launcher takes the batch budgets one request must fit in, "
            "--max-batch-prefill-tokens and --max-batch-total-tokens, as u32")
FLAGGED = {"linear": "linear", "dynamic": "dynamic"}  # rope types the launcher's flags express


def launch(served: Served, length: int | None) -> Launch:
    if served.gguf:
        return Launch(ENGINE, CANNOT, "TGI does not serve GGUF files: serve the folder 'hf-posenc patch --output' "
                                      "writes.", checked=CHECKED)
    if not served.native:
        return not_native(served, ENGINE, f"TGI loads the folder as the unpatched model, up to the original context "
                                          f"({served.original})")
    rope = served.rope
    kind = rope.get("rope_type", "default")
    theta = float(rope.get("rope_theta", 10000.0))
    if theta != 10000.0 or kind not in ("default", *FLAGGED):
        return Launch(ENGINE, CANNOT, "TGI's server reads config.rope_theta and config.rope_scaling; under transformers "
                                      "4 (TGI's releases) this config.json, written by transformers 5 with both inside "
                                      "rope_parameters, gives base 10000 and no scaling, and its launcher's flags "
                                      f"express only linear and dynamic scaling: not this model (rope_type {kind!r}, "
                                      f"rope_theta {theta:g}).", checked=CHECKED)
    # TGI's max_total_tokens: at most max_position_embeddings
    n = length_for(served, length, ENGINE, served.context, most=MOST)
    command = ["text-generation-launcher", "--model-id", served.path, "--max-input-tokens", str(n - 1),
               "--max-total-tokens", str(n)]
    notes = ["TGI is in maintenance mode since December 2025 (its README points to vLLM, SGLang and llama.cpp)"]
    if kind in FLAGGED:
        command += ["--rope-scaling", FLAGGED[kind], "--rope-factor", f"{float(rope['factor']):g}"]
        notes.append("--rope-scaling / --rope-factor repeat config.json's scaling, which TGI on transformers 4 would "
                     "not read from rope_parameters (they replace config.json's scaling)")
    if kind == "dynamic":
        notes.append("TGI's dynamic NTK follows the longest input it has seen, not each input's length")
    return Launch(ENGINE, NOT_MEASURED, f"TGI reads rope_type {kind!r}; not measured here.", command=command,
                  max_length=n, checked=CHECKED, notes=notes)


register_engine(Engine("tgi", ENGINE, launch=launch))
