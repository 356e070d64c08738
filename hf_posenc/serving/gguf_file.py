"""GGUF in, GGUF out: ``hf-posenc patch --model X.gguf --gguf OUT.gguf`` (:func:`patch_gguf`). The output holds the
source's tensors byte for byte (a quantized model stays quantized) and the method's RoPE metadata as llama.cpp
reads it; the source file is never written. Written through the ``gguf`` package (``GGUFReader``,
``GGUFWriter``) into a temporary file beside the output, renamed into place when complete.

How llama.cpp reads them (``src/llama-model.cpp`` ``load_hparams``, ``src/llama-context.cpp``, ggml's rope):
``{arch}.rope.freq_base`` the base; ``{arch}.rope.scaling.type`` none / linear (the default when absent) / yarn;
``{arch}.rope.scaling.factor`` s, used as freq_scale = 1 / s; ``{arch}.rope.scaling.original_context_length`` the
L of YaRN's ramp (default ``{arch}.context_length``); ``{arch}.rope.scaling.attn_factor`` multiplies the rotary
temperature, which for yarn is 0.1 ln s + 1 already (ggml). YaRN's ramp is beta_fast = 32, beta_slow = 1, with
floor/ceil bounds: the ``yarn_beta_*`` keys are read only by a few other architectures. A ``rope_freqs`` tensor
(llama's Llama 3.1 scaling, written by llama.cpp's converter) divides each frequency by its entry. So:

- none: type none, context L; pi: linear, factor s, context s L; ntk: type none, a new freq_base, context s L;
- yarn: yarn, factor s, original_context_length L, context s L (attn_factor when the temperature is not the
  default one); llama3: type none, ``rope_freqs.weight`` (f32) = original / scaled frequencies, context s L;
- longrope with one list (frozen, ``--freeze-at N``: the list of inputs of N tokens): type none, ``rope_freqs`` = its
  factors, ``attn_factor`` = its temperature (outside YaRN llama.cpp multiplies cos and sin by it), context s L.

llama.cpp cannot compute the others from a GGUF: they are refused by name before anything is written (the length-
dependent ones can be frozen first: ``--freeze-at``, :mod:`hf_posenc.serving.freezing`).
"""

from __future__ import annotations

import glob
import json
import math
import os
import tempfile
from collections import Counter, OrderedDict
from typing import Any

from ..adapters.layout import served_context
from ..adapters.rope_compose import kept_scaling
from ..checkpoints.models import read_config, resolve_source
from ..config import CONFIG_KEY, PosEncConfig, as_config
from ..encodings import rope as R
from ..io.files import OutputLock, umask
from ..methods.rope import SCALINGS, RopeScaling
from .freezing import check_freeze, freeze_config
from .gguf_compose import StatedScaling, composed

# the GGUF architectures whose files hf_posenc loads (transformers' GGUF reader) and patches (a RoPE decoder)
ARCHITECTURES = ("llama", "qwen2", "qwen3")
OWN_KEY = "hf_posenc.config"  # our record in the output: what was applied, from which original values
ROPE_FREQS = "rope_freqs.weight"


def _keys(arch: str) -> dict[str, str]:
    from gguf import Keys

    r = Keys.Rope
    names = {"type": r.SCALING_TYPE, "factor": r.SCALING_FACTOR, "attn_factor": r.SCALING_ATTN_FACTOR,
             "original": r.SCALING_ORIG_CTX_LEN, "finetuned": r.SCALING_FINETUNED, "base": r.FREQ_BASE,
             "dim": r.DIMENSION_COUNT, "context": Keys.LLM.CONTEXT_LENGTH, "heads": Keys.Attention.HEAD_COUNT,
             "embedding": Keys.LLM.EMBEDDING_LENGTH, "key_length": Keys.Attention.KEY_LENGTH}
    for extra in ("SCALING_YARN_LOG_MUL", "SCALING_YARN_EXT_FACTOR", "SCALING_YARN_ATTN_FACTOR",
                  "SCALING_YARN_BETA_FAST", "SCALING_YARN_BETA_SLOW", "SCALE_LINEAR"):
        if hasattr(r, extra):
            names[extra.lower()] = getattr(r, extra)
    return {k: v.format(arch=arch) for k, v in names.items()}


def _scaling_keys(keys: dict[str, str]) -> list[str]:
    """Every key of the RoPE scaling: the patch writes those it needs, the others of the source go."""
    return [v for k, v in keys.items() if k in ("type", "factor", "attn_factor", "original", "finetuned")
            or k.startswith(("scaling_yarn", "scale_linear"))]


def is_gguf(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False


# The last few GGUF files read, by identity and state: parsing a file's metadata (its vocabulary above all) takes
# seconds, and one command reads the same file several times (its facts, its record, its patch). A file changed or
# replaced since has another key; a file this module writes is forgotten (its old mapping would keep the space).
_READERS: OrderedDict[tuple, Any] = OrderedDict()
_READERS_KEPT = 2


def _file_key(path: str) -> tuple:
    st = os.stat(path)
    return (os.path.realpath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _forget(path: str) -> None:
    real = os.path.realpath(path)
    for key in [k for k in _READERS if k[0] == real]:
        del _READERS[key]


def _reader(path: str):
    from gguf import GGUFReader

    if not os.path.isfile(path):
        raise ValueError(f"GGUF file not found: {path}")
    if not is_gguf(path):
        raise ValueError(f"{path} is not a GGUF file (it does not start with the 'GGUF' magic); --gguf patches a "
                         ".gguf model (give an HF folder with --output instead)")
    key = _file_key(path)
    if key in _READERS:
        _READERS.move_to_end(key)
        return _READERS[key]
    try:
        reader = GGUFReader(path, "r")
    except Exception as err:  # noqa: BLE001 -- the reader's own words, whatever it raises on a damaged file
        raise ValueError(f"{path} cannot be read as GGUF ({' '.join(str(err).split())[:200]}); it is truncated or "
                         "damaged") from None
    _forget(path)
    _READERS[key] = reader
    while len(_READERS) > _READERS_KEPT:
        _READERS.popitem(last=False)
    return reader


def _architecture(reader, path: str, does: str) -> str:
    """The GGUF's ``general.architecture``, refused by name unless hf_posenc ``does`` (patches, checks) it."""
    arch = str(_value(reader, "general.architecture", ""))
    if arch not in ARCHITECTURES:
        raise ValueError(f"{path}: GGUF architecture {arch or '(none)'!r} is not one hf_posenc {does} (it {does} "
                         f"{', '.join(ARCHITECTURES)})")
    return arch


def _value(reader, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    if field is None or not field.data:
        return default
    value = field.contents()
    return value


def _original(reader, keys: dict[str, str], path: str) -> dict[str, Any]:
    """The source's unscaled ``context_length`` and ``freq_base``: those our record keeps when the source is itself
    an output of :func:`patch_gguf` (its metadata then holds the scaled ones: patching it again starts from the
    original, never compounds), else the metadata's."""
    raw = _value(reader, OWN_KEY)
    if raw is None:
        return {"context_length": _value(reader, keys["context"]), "freq_base": _value(reader, keys["base"])}
    return dict(_stored_record(raw, path)["original"])


def _stored_record(raw: str, path: str) -> dict[str, Any]:
    """Our record in a GGUF (:data:`OWN_KEY`), read and checked once: its ``config`` (a :class:`PosEncConfig`, parsed
    into ``cfg``), ``original`` values and, for a frozen method, ``frozen_at``; a damaged one refused by name."""
    try:
        record = json.loads(raw)
        for key in ("config", "original"):
            if not isinstance(record.get(key), dict):
                raise ValueError(f"{key} is {record.get(key)!r}, not a JSON object")
        cfg = PosEncConfig.from_dict(record["config"])
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise ValueError(f"{path}: its {OWN_KEY} metadata is damaged ({err}); patch the source GGUF again") from None
    numbers = {f"original.{k}": record["original"].get(k) for k in ("context_length", "freq_base")}
    numbers["frozen_at"] = record.get("frozen_at")
    for key, value in numbers.items():  # None: not stated (a source without the key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value) or value <= 0):
            raise ValueError(f"{path}: its {OWN_KEY} metadata is damaged ({key} is {value!r}, not a positive "
                             "number); patch the source GGUF again")
    return {**record, "cfg": cfg, "original": dict(record["original"])}


def _geometry(reader, keys: dict[str, str], cfg: PosEncConfig, path: str) -> tuple[R.RopeGeometry, str]:
    """(base, rotary dim, original context) of the source, and what its metadata says of a scaling it has."""
    original = _original(reader, keys, path)
    if _value(reader, OWN_KEY) is not None:  # our own output: its original values, its scaling replaced
        L = cfg.original_max_position_embeddings or original["context_length"]
        base = float(original["freq_base"] or 10000.0)
        return R.RopeGeometry(base, _rotary_dim(reader, keys, path), int(L)), "the earlier hf_posenc patch is replaced"
    if ROPE_FREQS in {t.name for t in reader.tensors} and cfg.original_max_position_embeddings is None:
        raise ValueError(f"{path} holds a {ROPE_FREQS} tensor (a Llama 3.1 scaling, whose context_length is already "
                         f"the extended one, {_value(reader, keys['context'])}): give the context the model was "
                         "trained for with --original-max-position-embeddings (8192 for Llama 3.1)")
    base = float(_value(reader, keys["base"], 10000.0))
    dim = _rotary_dim(reader, keys, path)
    context = _value(reader, keys["context"])
    kind = str(_value(reader, keys["type"], "") or "")
    factor = float(_value(reader, keys["factor"], 0.0) or 0.0)
    scaled = kind not in ("", "none") and factor not in (0.0, 1.0)
    L = cfg.original_max_position_embeddings
    if L is None and scaled:
        L = _value(reader, keys["original"])
        if not L:
            raise ValueError(f"{path} already has a {kind} RoPE scaling (factor {factor:g}) without "
                             f"{keys['original']}; give the context the model was trained for with "
                             "--original-max-position-embeddings")
    L = int(L or context or 0)
    if not L:
        raise ValueError(f"{path}: its metadata has no {keys['context']}; give --original-max-position-embeddings")
    note = f"the source's {kind} scaling (factor {factor:g}) is replaced" if scaled else ""
    return R.RopeGeometry(base, int(dim), L), note


def _stated(reader, keys: dict[str, str], original: dict[str, Any]) -> StatedScaling:
    """The scaling the source states beyond its base: for our own output, the one its source stated (kept in the
    record's ``original``, :func:`_original`); else its metadata's type, factor, YaRN original context, attn_factor,
    context and rope_freqs."""
    if _value(reader, OWN_KEY) is not None:
        kept = original.get("stated")
        return StatedScaling(**kept) if isinstance(kept, dict) else StatedScaling("none", 1.0, 0, 1.0, 0)
    freqs = next((t.data for t in reader.tensors if t.name == ROPE_FREQS), None)
    context = int(_value(reader, keys["context"], 0) or 0)
    factor = float(_value(reader, keys["factor"], 0.0) or _value(reader, keys.get("scale_linear", ""), 0.0) or 1.0)
    kind = str(_value(reader, keys["type"], "") or ("linear" if factor != 1.0 else "none"))  # llama.cpp's default
    return StatedScaling(kind, factor, int(_value(reader, keys["original"], 0) or context),
                         float(_value(reader, keys["attn_factor"], 1.0)), context,
                         [float(x) for x in freqs] if freqs is not None else [])


def _composed(reader, keys: dict[str, str], cfg: PosEncConfig, stated: StatedScaling, original: dict[str, Any],
              path: str, arch: str) -> tuple[PosEncConfig, R.RopeGeometry, str]:
    """``cfg`` on top of the source's own scaling (:mod:`.gguf_compose`): the frozen longrope that computes it, the
    geometry over the source's current context, and the note that says so."""
    what = "a rope_freqs tensor" if stated.freqs else f"a {stated.kind} scaling (factor {stated.factor:g})"
    if not _reads_rope_freqs(arch):
        raise ValueError(f"cannot put {cfg.method} on top of the {what} of this {arch} GGUF: the result is a "
                         f"per-dimension scaling (rope_freqs), which llama.cpp's {arch} graph does not read; give "
                         "--original-max-position-embeddings to replace the source's scaling instead")
    base = float(original["freq_base"] or 10000.0)
    dim = _rotary_dim(reader, keys, path)
    result = composed(cfg, base, dim, stated)
    note = (f"the source's RoPE states {what}, context {stated.context}: {cfg.to_text()} is put on top (context "
            f"{SCALINGS[cfg.method].max_position(cfg.factor, stated.context)}), written as a longrope with one list "
            "(a GGUF holds one set of frequencies: shorter inputs get them too); to replace the source's scaling "
            "instead, give --original-max-position-embeddings")
    return result, R.RopeGeometry(base, dim, stated.context), note


def _rotary_dim(reader, keys: dict[str, str], path: str) -> int:
    dim = _value(reader, keys["dim"]) or _value(reader, keys["key_length"])
    if not dim:
        heads, width = _value(reader, keys["heads"]), _value(reader, keys["embedding"])
        if not heads or not width:
            raise ValueError(f"{path}: its metadata gives neither {keys['dim']} nor the head count and width to "
                             "derive the rotary dimension from")
        dim = int(width) // int(heads)
    return int(dim)


def method_refusal(cfg: PosEncConfig) -> str | None:
    """Why no GGUF, of any architecture, holds ``cfg`` -- its method, or its knobs' values (None: a GGUF's RoPE
    metadata can express it)."""
    name = cfg.method
    scaling = _scaling(cfg)
    if scaling is not None and scaling.gguf is None and scaling.gguf_refusal:
        return scaling.gguf_refusal.format(name=name, architectures=", ".join(ARCHITECTURES))
    if scaling is None or scaling.gguf is None:
        return (f"llama.cpp cannot compute {name} (a{'n' if cfg.spec.kind[0] in 'aeiou' else ''} {cfg.spec.kind} "
                "method); a GGUF's RoPE metadata expresses only none, pi (linear), ntk (freq_base), yarn and llama3 "
                "(rope_freqs)")
    return scaling.gguf_any_check(cfg.params) if scaling.gguf_any_check else None


def refusal(cfg: PosEncConfig, arch: str) -> str | None:
    """Why llama.cpp cannot compute ``cfg`` from a GGUF of ``arch`` (None: it can): :func:`method_refusal`, then
    what the architecture's GGUF reading adds."""
    why = method_refusal(cfg)
    if why:
        return why
    name, p, scaling = cfg.method, cfg.params, _scaling(cfg)
    if p.get("layer_types") is not None:
        return "layer_types: a GGUF of these architectures has one RoPE for every layer"
    why = scaling.gguf_check(p, arch) if scaling.gguf_check else None
    if why is None and scaling.gguf_freqs and not _reads_rope_freqs(arch):
        why = f"{name}: llama.cpp reads its rope_freqs tensor for llama-architecture GGUFs, not {arch}"
    return why


def _scaling(cfg: PosEncConfig) -> RopeScaling | None:
    """The RoPE record of ``cfg``'s method (None for a method of another kind)."""
    return SCALINGS.get(cfg.method) if cfg.spec.kind in ("rope", "none") else None


def _writes(cfg: PosEncConfig) -> bool:
    """A GGUF's metadata expresses ``cfg``'s method (its record says how)."""
    scaling = _scaling(cfg)
    return bool(scaling and scaling.gguf)


# the architectures (of ARCHITECTURES) whose llama.cpp graph passes the rope_freqs factors to its rotation
# (src/models/llama.cpp: model.get_rope_factors; qwen2.cpp and qwen3.cpp pass none, whatever gguf-py's tensor
# table lists for them)
READS_ROPE_FREQS = ("llama",)


def _reads_rope_freqs(arch: str) -> bool:
    return arch in READS_ROPE_FREQS


def _rope_metadata(cfg: PosEncConfig, geom: R.RopeGeometry) -> tuple[dict[str, Any], Any]:
    """{short key name: value} of the RoPE metadata ``cfg`` needs, and the ``rope_freqs`` tensor (or None)."""
    s, L = cfg.factor, geom.original_max_position_embeddings
    scaling = SCALINGS[cfg.method]
    out: dict[str, Any] = {"context": scaling.max_position(s, L), "base": geom.base, "type": "none"}
    meta, freqs = scaling.gguf(s, L, cfg.params, geom)
    out.update(meta)
    if freqs is not None:
        import numpy as np

        freqs = freqs.numpy().astype(np.float32)
    return out, freqs


def llama_cpp_metadata(cfg: PosEncConfig, geom: R.RopeGeometry) -> dict[str, Any]:
    """The RoPE metadata llama.cpp needs for ``cfg`` on a model of ``geom`` (short names: type, factor, original,
    base, attn_factor, context), ``freqs``: whether a rope_freqs tensor is needed too, ``base_changed``: whether
    the base differs from the model's. The caller has checked :func:`refusal`."""
    meta, freqs = _rope_metadata(cfg, geom)
    return {**meta, "freqs": freqs is not None, "base_changed": abs(meta["base"] - geom.base) > 1e-6 * geom.base}


def _file_metadata(reader, keys: dict[str, str], path: str) -> dict[str, Any]:
    """The RoPE metadata a GGUF holds, in :func:`llama_cpp_metadata`'s terms."""
    original = _original(reader, keys, path)
    meta = {"type": str(_value(reader, keys["type"], "") or "none"), "context": _value(reader, keys["context"]),
            "base": float(_value(reader, keys["base"], 10000.0))}
    for short in ("factor", "original", "attn_factor"):
        if _value(reader, keys[short]) is not None:
            meta[short] = _value(reader, keys[short])
    meta["freqs"] = ROPE_FREQS in {t.name for t in reader.tensors}
    meta["base_changed"] = bool(original.get("freq_base")) and abs(meta["base"] - float(original["freq_base"])) > 1e-6
    return meta


def _check_output(dst: str, src: str) -> str:
    path = os.path.abspath(dst)
    if os.path.exists(src) and os.path.exists(path) and os.path.samefile(path, src):
        raise ValueError(f"--gguf {dst!r} is the model being patched; give another file, so that the source stays as "
                         "it is")
    if os.path.isdir(path):
        raise ValueError(f"--gguf {dst!r} is a folder; give the path of the .gguf file to write")
    if not path.endswith(".gguf"):
        raise ValueError(f"--gguf {dst!r}: give a path ending in .gguf (llama.cpp and Ollama look for it)")
    if os.path.lexists(path):
        if os.path.islink(path) or not is_gguf(path) or OWN_KEY not in _reader(path).fields:
            raise ValueError(f"--gguf {dst!r} exists and was not written by hf-posenc patch --gguf; give a new path, "
                             "or move it away yourself: hf-posenc never replaces a file it did not write")
    folder = os.path.dirname(path)
    if not os.path.isdir(folder):
        raise ValueError(f"--gguf {dst!r}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise ValueError(f"--gguf {dst!r}: {folder} is not writable")
    return path


def patch_gguf(src: str, dst: str, config: Any, freeze_at: int | None = None) -> dict[str, Any]:
    """Write ``dst``: the GGUF ``src`` with the same tensors and ``config``'s RoPE metadata for llama.cpp (module
    doc). ``config``: a :class:`PosEncConfig`, a dict or a method name; ``freeze_at``: first turn a length-dependent
    method into the static one equal to it at that many tokens (:func:`hf_posenc.serving.freezing.freeze_config`).
    Returns {"output", "config" (what was written, resolved), "metadata" {key: value}, "tensors" (copied),
    "added" (rope_freqs: written or replaced), "note"}."""
    cfg = as_config(config)
    if freeze_at is not None:
        check_freeze(cfg, freeze_at)
        if not SCALINGS[_scaling(cfg).freezes_to].gguf:  # frozen, still not written: refused before reading anything
            raise ValueError(f"cannot write {cfg.method} into a GGUF, frozen or not: {refusal(cfg, 'llama')}")
    elif (why := refusal(cfg, "llama")) and not _writes(cfg):  # refused by name before reading anything
        raise ValueError(f"cannot write {cfg.method} into a GGUF: {why}")
    src = os.fspath(src)
    path = _check_output(os.fspath(dst), src)
    reader = _reader(src)
    arch = _architecture(reader, src, "patches")
    keys = _keys(arch)
    original = _original(reader, keys, src)
    stated = _stated(reader, keys, original)
    on_top = stated.scaled and cfg.original_max_position_embeddings is None
    if on_top and cfg.spec.kind == "none":
        raise ValueError(f"{src} already states a RoPE scaling, which none would remove: the source is the unchanged "
                         "model already (nothing to write); give --original-max-position-embeddings to write plain "
                         "RoPE over that context")
    if on_top and cfg.spec.kind == "rope":
        if freeze_at is not None:  # the static method equal to it at N, over the source's current context
            cfg, freeze_at = freeze_config(cfg, freeze_at, original=stated.context), None
        cfg, geom, note = _composed(reader, keys, cfg, stated, original, src, arch)
    else:
        geom, note = _geometry(reader, keys, cfg, src)
        cfg = PosEncConfig(cfg.method, cfg.factor if cfg.spec.uses_factor else None,
                           geom.original_max_position_embeddings, cfg.params)
    if freeze_at is not None:
        cfg = freeze_config(cfg, freeze_at)
    why = refusal(cfg, arch)
    if why:
        raise ValueError(f"cannot write {cfg.method} into a GGUF: {why}")
    if ROPE_FREQS in {t.name for t in reader.tensors} and not _scaling(cfg).gguf_freqs:
        raise ValueError(f"{src} holds a {ROPE_FREQS} tensor (a Llama 3.1 scaling llama.cpp applies and transformers "
                         "does not read), which the metadata of another method cannot undo; patch the model it was "
                         "converted from instead")
    short, freqs = _rope_metadata(cfg, geom)
    record = {"config": cfg.to_dict(), "original": original}
    if stated.scaled:  # the source's own scaling: patching this output again composes on it, never on plain RoPE
        record["original"]["stated"] = stated.to_dict()
    if freeze_at is not None:
        record["frozen_at"] = freeze_at
    metadata = {keys[k]: v for k, v in short.items()}
    _write(reader, path, arch, metadata, _scaling_keys(keys), freqs, json.dumps(record, sort_keys=True))
    return {"output": path, "config": cfg, "metadata": metadata, "tensors": len(reader.tensors),
            "added": [ROPE_FREQS] if freqs is not None else [], "note": note}


def _typed(value: Any, old_type):
    """A new value and its GGUF type: the source's type for a key it had, else f32 / u32 / string."""
    from gguf import GGUFValueType as T

    if old_type is not None:
        kind = old_type
    elif isinstance(value, str):
        kind = T.STRING
    elif isinstance(value, int):
        kind = T.UINT32
    else:
        kind = T.FLOAT32
    if kind in (T.FLOAT32, T.FLOAT64):
        return float(value), kind
    if kind in (T.UINT32, T.INT32, T.UINT64, T.INT64):
        return int(math.ceil(value)), kind
    return value, kind


def _write(reader, path: str, arch: str, metadata: dict[str, Any], scaling: list[str], freqs,
           record: str | None) -> None:
    """Copy ``reader``'s file to ``path`` with ``metadata`` set (in the source's order where it had the key),
    the other ``scaling`` keys dropped, ``freqs`` as ``rope_freqs.weight`` and ``record`` under :data:`OWN_KEY`;
    through a temporary file beside ``path`` that replaces it only when complete, under the lock
    ``.NAME.hf_posenc.lock`` beside it (a second run on the same output is refused), after removing what a killed
    run left there."""
    prefix = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.")
    lock = None
    try:  # the lock taken inside: a kill right after it is taken still releases it
        lock = OutputLock(path, path=f"{prefix}hf_posenc.lock", flag="--gguf")
        _remove_leftovers(prefix)
        _write_locked(reader, path, arch, metadata, scaling, freqs, record)
    finally:
        if lock is not None:
            lock.release()


def _remove_leftovers(prefix: str) -> None:
    """The temporary files a run killed while writing the same output left (only such a run writes these names;
    the caller holds the output's lock, so none is being written now)."""
    for leftover in glob.glob(glob.escape(prefix) + "[a-z0-9_]" * 8 + ".tmp"):
        os.unlink(leftover)


def _write_locked(reader, path: str, arch: str, metadata: dict[str, Any], scaling: list[str], freqs,
                  record: str | None) -> None:
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter, Keys

    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    os.close(fd)
    try:
        writer = GGUFWriter(tmp, arch=arch, endianess=reader.endianess)
        alignment = _value(reader, Keys.General.ALIGNMENT)
        if alignment is not None:
            writer.data_alignment = int(alignment)
        pending = dict(metadata)
        for field in reader.fields.values():
            name = field.name
            if name == Keys.General.ARCHITECTURE or name.startswith("GGUF.") or name == OWN_KEY:
                continue
            if name in pending:
                value, kind = _typed(pending.pop(name), field.types[0])
                writer.add_key_value(name, value, kind)
            elif name not in scaling:
                kind = field.types[0]
                sub = field.types[-1] if kind == GGUFValueType.ARRAY else None
                writer.add_key_value(name, field.contents(), kind, sub_type=sub)
        for name, value in pending.items():
            writer.add_key_value(name, *_typed(value, None))
        if record is not None:  # (None: a copy without our record, as another tool would write it)
            writer.add_key_value(OWN_KEY, record, GGUFValueType.STRING)
        tensors = [(t.name, t.data, t.tensor_type, reader.endianess) for t in reader.tensors]
        if freqs is not None:
            new = (ROPE_FREQS, freqs, GGMLQuantizationType.F32, None)
            at = next((i for i, t in enumerate(tensors) if t[0] == ROPE_FREQS), None)
            if at is None:
                tensors.insert(0, new)
            else:
                tensors[at] = new
        for name, data, kind, _ in tensors:
            writer.add_tensor_info(name, data.shape, data.dtype, data.nbytes, kind)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for _, data, _, endian in tensors:
            writer.write_tensor_data(np.ascontiguousarray(data), tensor_endianess=endian)
        writer.close()
        os.chmod(tmp, 0o666 & ~umask())
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        _forget(path)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def stored_patch(path: str, hf_config) -> PosEncConfig | None:
    """The configuration a GGUF written by :func:`patch_gguf` records (None for any other GGUF). transformers'
    GGUF reader takes ``context_length`` and ``freq_base`` but no scaling keys (it reads them for gpt-oss only),
    so ``hf_config`` gets the source's original values back, for the patch to be applied again on them."""
    if not os.path.isfile(path) or not is_gguf(path):
        return None
    reader = _reader(path)
    raw = _value(reader, OWN_KEY)
    if raw is None:
        return None
    record = _stored_record(raw, path)
    cfg, original = record["cfg"], record["original"]
    if original.get("context_length"):
        hf_config.max_position_embeddings = int(original["context_length"])
    rp = getattr(hf_config, "rope_parameters", None)
    if original.get("freq_base") and isinstance(rp, dict):
        hf_config.rope_parameters = {**rp, "rope_theta": float(original["freq_base"])}
    return cfg


def original_before_load(model: str, cfg: PosEncConfig) -> int | None:
    """The original context of ``model`` read from its config alone (a GGUF's metadata), for
    :func:`hf_posenc.serving.freezing.check_freeze` before the weights load: ``cfg``'s when it gives one, a patched
    checkpoint's stored original, else the config's ``max_position_embeddings``; None when it cannot be read (the
    check then runs after the load)."""
    if cfg.original_max_position_embeddings:
        return cfg.original_max_position_embeddings
    try:
        source = resolve_source(model)
        return trained_context(read_config(source), source)
    except Exception:  # noqa: BLE001 -- only a pre-check: the load that follows reports what is wrong
        return None


def trained_context(hf_config, source) -> int | None:
    """The context a model (``hf_config``, loaded from ``source``) was trained for, from its config alone: a patched
    checkpoint's stored original (its config advertises the extended one; a scaling the checkpoint is, its
    advertised context: :func:`rope_compose.kept_scaling`), a GGUF written by :func:`patch_gguf`'s
    record (``hf_config`` gets the original values back), else the context its RoPE serves now
    (``max_position_embeddings``, or a YaRN's factor x original where more: ``adapters.layout.current_context``);
    None if none is stated."""
    block = getattr(hf_config, CONFIG_KEY, None)
    if isinstance(block, dict) and block.get("original_max_position_embeddings") and kept_scaling(block) is None:
        return int(block["original_max_position_embeddings"])  # (a kept scaling: the context the checkpoint has)
    if "gguf_file" in source.kwargs:
        stored = stored_patch(os.path.join(source.path, source.kwargs["gguf_file"]), hf_config)
        if stored is not None:
            return stored.original_max_position_embeddings
    n = served_context(hf_config)
    return int(n) if n else None


FULL_PRECISION = ("F32", "F16", "BF16")  # weight types llama.cpp multiplies without rounding them to integers


def served_facts(path: str) -> dict[str, Any]:
    """What serve-check needs of a GGUF before loading it: ``method`` (what :func:`patch_gguf` recorded, "none"
    for a GGUF it did not write), ``original`` (the trained context L), ``context`` (the metadata's, the scaled
    one for a patched file), ``arch`` and ``quantized`` (the weight types other than F32/F16/BF16, by count).
    ``metadata``: its RoPE metadata (:func:`llama_cpp_metadata`'s terms).
    A GGUF with a RoPE scaling hf_posenc did not write is refused: hf_posenc's loader would compute it unscaled
    (transformers reads no scaling key from a GGUF), so there is nothing to compare it with."""
    reader = _reader(path)
    arch = _architecture(reader, path, "loads and checks")
    keys = _keys(arch)
    raw, meta = _value(reader, OWN_KEY), _file_metadata(reader, keys, path)
    quantized = dict(Counter(t.tensor_type.name for t in reader.tensors if t.tensor_type.name not in FULL_PRECISION))
    context = int(meta["context"] or 0)
    if raw is None:
        factor = float(meta.get("factor") or 0.0)
        if (meta["type"] != "none" and factor not in (0.0, 1.0)) or meta["freqs"]:
            what = (f"a {meta['type']} RoPE scaling (factor {factor:g})" if meta["type"] != "none"
                    else f"a {ROPE_FREQS} tensor")
            raise ValueError(f"{path} has {what} that hf_posenc did not write: its GGUF loader (transformers') reads "
                             "no scaling from a GGUF, so it has nothing to compare llama.cpp with; serve-check takes a "
                             "GGUF written by 'hf-posenc patch --gguf', an unscaled GGUF, or the HF folder")
        return {"method": "none", "original": context, "context": context, "arch": arch, "quantized": quantized,
                "metadata": meta}
    record = _stored_record(raw, path)
    return {"method": record["cfg"].method, "original": int(record["cfg"].original_max_position_embeddings or 0),
            "context": context, "arch": arch, "quantized": quantized, "metadata": meta,
            "frozen_at": record.get("frozen_at")}
