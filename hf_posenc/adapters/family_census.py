"""The family census's record: which causal-LM families of the installed transformers take each method, as the narrow
twin of their default config (``tests/test_family_census_*.py`` check every family against it and name the one whose
outcome differs). A family a method takes is patched, runs, unpatches bit for bit and passes its kind's check (a
RoPE scaling saves and loads back with the same logits, by plain transformers where the block is native; an
attention-level method equals the unpatched model inside its window; nope stops reading the positions);
``hf-posenc methods`` lists it. One it does not take refuses it by name, or its twin cannot be built or run (the
census says why). Some take a length-dependent or per-dimension scaling only with cache='stale', which their refusal
of the default names.

After a transformers upgrade, run the census and move the families it names."""

from ..methods import BUILT_IN, METHODS

# the families each RoPE scaling takes at x2 (less REFUSES)
ROPE = (
    "afmoe", "apertus", "apertus1p5_text", "arcee", "aria_text", "axk1", "axk2", "beam", "bitnet", "cohere", "cohere2",
    "cohere2_moe", "cwm", "deepseek_v2", "deepseek_v3", "deepseek_v32", "diffllama", "doge", "dory", "emu3",
    "ernie4_5", "ernie4_5_moe", "exaone", "exaone4", "exaone_moe", "falcon", "falcon_h1", "flex_olmo", "flint", "fuyu",
    "gemma", "gemma2", "gemma3", "gemma3_text", "gemma3n_text", "gemma4", "gemma4_text", "gemma4_unified",
    "gemma4_unified_text", "glm", "glm4", "glm4_moe", "glm4_moe_lite", "glm_moe_dsa", "got_ocr2",
    "gpt_neox", "gpt_neox_japanese", "gpt_oss", "granite", "granitemoe", "granitemoeshared", "helium", "hrm_text",
    "hunyuan_v1_dense", "hunyuan_v1_moe", "hy_v3", "hy_v4", "hyperclovax", "internlm3", "iquestcoder", "jais2",
    "jetmoe", "kolibri1", "laguna", "lara_mini", "lfm2", "lfm3", "llama", "llama4", "llama4_text", "mellum", "minicpm3",
    "minimax", "minimax_m2", "ministral", "mistral", "mixtral", "mllama", "modernbert-decoder",
    "moss_transcribe_diarize", "nanochat", "nemotron", "olmo", "olmo2", "olmo3", "olmo_hybrid", "olmoe", "persimmon",
    "phi", "phi3", "phi4_multimodal", "qwen2", "qwen2_moe", "qwen3", "qwen3_5", "qwen3_5_moe", "qwen3_5_moe_text",
    "qwen3_5_text", "qwen3_moe", "qwen3_next", "sarvam_mla", "sarvam_moe", "seed_oss", "smollm3", "solar_open",
    "stablelm", "starcoder2", "vaultgemma", "youtu", "zaya"
)

# the families one attention-level method or more takes
ATTENTION = (
    "apertus", "apertus1p5_text", "arcee", "aria_text", "axk1", "bitnet", "cwm", "deepseek_v3", "diffllama", "doge",
    "emu3", "exaone", "falcon_h1", "flex_olmo", "fuyu", "gemma", "gemma2", "gemma3", "gemma3_text", "gemma3n_text",
    "gemma4", "gemma4_text", "gemma4_unified", "gemma4_unified_text", "glm4_moe", "glm4_moe_lite", "got_ocr2",
    "gpt_oss", "granite", "granitemoe", "granitemoeshared", "hy_v3", "hyperclovax", "internlm3", "iquestcoder",
    "jais2", "laguna", "lara_mini", "lfm2", "lfm3", "llama", "mellum", "mimo_v2_flash", "minicpm3", "minimax",
    "minimax_m2", "ministral3", "mixtral", "moss_transcribe_diarize", "nemotron", "olmo", "olmo2", "olmo3",
    "olmo_hybrid", "olmoe", "persimmon", "phi", "phi3", "phi4_multimodal", "phimoe", "qwen2", "qwen2_moe", "qwen3",
    "qwen3_5", "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_5_text", "qwen3_moe", "qwen3_next", "sarvam_mla",
    "sarvam_moe", "seed_oss", "smollm3", "solar_open", "stablelm", "starcoder2", "vaultgemma", "youtu", "zaya"
)

# the families nope takes (the rotary frequencies set to zero; the encoders' nope is their own adapter's)
NOPE = (
    "afmoe", "apertus", "apertus1p5_text", "arcee", "aria_text", "beam", "bert", "bert-generation", "big_bird",
    "bitnet", "camembert", "cohere", "cohere2", "cohere2_moe", "cwm", "data2vec-text", "diffllama", "doge", "dory",
    "electra", "emu3", "ernie", "ernie4_5", "ernie4_5_moe", "exaone", "exaone4", "exaone_moe", "falcon", "falcon_h1",
    "flex_olmo", "flint", "gemma", "gemma2", "gemma3_text", "gemma3n_text", "gemma4_text", "gemma4_unified_text",
    "git", "glm", "glm4",
    "glm4_moe", "gpt_neox", "gpt_neox_japanese", "gpt_oss", "granite", "granitemoe", "granitemoeshared", "helium",
    "hrm_text", "hunyuan_v1_dense", "hunyuan_v1_moe", "hy_v3", "hyperclovax", "internlm3", "iquestcoder", "jais2",
    "jetmoe", "kolibri1", "laguna", "lara_mini", "lfm2", "lfm3", "llama", "llama4", "llama4_text", "megatron-bert",
    "mellum", "mimo_v2_flash", "minimax", "minimax_m2", "ministral", "ministral3", "mistral", "mixtral", "mllama",
    "modernbert-decoder", "nanochat", "nemotron", "olmo", "olmo2", "olmo3", "olmo_hybrid", "olmoe", "persimmon", "phi",
    "phi3", "phi4_multimodal", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "qwen3_next", "rembert", "roberta",
    "roberta-prelayernorm", "roc_bert", "sarvam_moe", "seed_oss", "smollm3", "solar_open", "stablelm", "starcoder2",
    "vaultgemma", "xlm-roberta", "xlm-roberta-xl", "zaya"
)

RECORD = {"rope": ROPE, "attention": ATTENTION, "nope": NOPE}
CENSUS_SWAPS = ("nope",)  # the swaps the census runs, each with a record of its own
# the families of its kind's record a method refuses (by name): the length-dependent scalings on a checkpoint whose
# RoPE is already scaled (apertus, cwm: llama3; gpt_oss: yarn)
_ALREADY_SCALED = ("apertus", "apertus1p5_text", "cwm", "gpt_oss")
REFUSES = {"dynamic_ntk": _ALREADY_SCALED, "dynamic_yarn": _ALREADY_SCALED}


def kind_of(method: str) -> str | None:
    """The record a registered method's census outcome is kept in: its kind's for a RoPE scaling or an
    attention-level method hf_posenc ships (the census runs every one of them), its own for a swap the census runs
    (nope); None for a method the census does not run (a plugin's: never proven on the families here)."""
    spec = METHODS.get(method)
    if spec is None or method not in BUILT_IN:
        return None
    if spec.kind in ("rope", "attention"):
        return spec.kind
    return spec.name if spec.kind == "swap" and spec.name in CENSUS_SWAPS else None


def census_methods(kind: str) -> list[str]:
    """The registered methods whose census outcome the record ``kind`` holds."""
    return [name for name in METHODS if kind_of(name) == kind]


def takes(method: str) -> tuple[str, ...]:
    """The families the census proves ``method`` takes (none for a method it does not run)."""
    kind = kind_of(method)
    return tuple(f for f in RECORD[kind] if f not in REFUSES.get(method, ())) if kind else ()
