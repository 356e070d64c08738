"""PosEncConfig: the spec of one positional-encoding change, validated on creation.

It is what ``patch`` applies and what ``save_pretrained`` records in ``config.json`` under the
``hf_posenc`` key, so that ``hf_posenc.from_pretrained`` can apply it again.

SavedBlock: The ``hf_posenc`` block that a patched checkpoint's ``config.json`` holds: what was applied (a
PosEncConfig), by which family adapter, whether plain transformers rebuilds it (``native``), the config fields the patch
changed as they were (``original``), and which hf_posenc wrote it (``version``, ``schema``).

Schema 1: hf_posenc 0.1.0 (no ``schema`` key). Schema 2: the same fields plus ``schema``. Schema 3 (written only
where it is used): plus ``asked``, the configuration asked for when what was applied is a composition over the
checkpoint's own scaling (``yarn:factor=2`` on Llama 3.1, applied as a longrope). Schema 4 (written only where it is
used): plus ``pretrained_context``, for a patch applied over a composition hf_posenc saved (another composition on
it, an attention-level method keeping it, a scaling replacing it): the context the checkpoint's own scaling under
that composition is computed from, which the block's ``original`` (the composition) no longer states. A reader
takes every schema up to its own and refuses a newer one, naming it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ._version import __version__
from .config_syntax import FIELDS, check_keys, config_error, config_text, fields_text, split_spec
from .methods import MIN_ORIGINAL_CONTEXT, check_factor, resolve_method, resolve_params

CONFIG_KEY = "hf_posenc"  # the key of the block in config.json
BLOCK_FIELDS = {"version", "native", "original", "family", "schema"}  # what a stored block adds to a PosEncConfig
SCHEMA = 4  # the newest schema this hf_posenc reads (and writes, where a block has ``pretrained_context``)
ASKED_SCHEMA = 3  # what a block with ``asked`` and no ``pretrained_context`` is written with
PLAIN_SCHEMA = 2  # what a block without ``asked`` is written with: earlier releases read it
CONFIG_FIELDS = ("method", "factor", "original_max_position_embeddings", "params")
# the family adapters' names: hf_posenc.adapters registers them when imported (it imports this)
FAMILIES: list[str] = []


@dataclass
class PosEncConfig:
    """One positional-encoding change.

    method: a name from ``hf_posenc.list_methods()`` (aliases accepted, stored canonical).
    factor: the context-extension factor s (>= 1); methods that take none leave it at 1.
    original_max_position_embeddings: the context length the model was trained on; ``None`` means
        "read it from the model when patching".
    params: the method's own knobs; unknown knobs are rejected, defaults are filled in.
    """

    method: str
    factor: float | None = None
    original_max_position_embeddings: int | None = None
    params: dict[str, Any] = field(default_factory=dict)
    # what was asked, when this configuration is the composition computed from it on a checkpoint whose RoPE is
    # already scaled (``yarn:factor=2`` on Llama 3.1, applied as a longrope); not part of the configuration's value
    asked: PosEncConfig | None = field(default=None, compare=False, repr=False)
    # applied over a composition hf_posenc saved (a composition on it, a method keeping it, a scaling replacing it):
    # the context the checkpoint's own scaling under that composition is computed from (SavedBlock: schema 4); not
    # part of the configuration's value either
    pretrained_context: int | None = field(default=None, compare=False, repr=False)

    def __repr__(self) -> str:
        own = (f"PosEncConfig(method={self.method!r}, factor={self.factor!r}, original_max_position_embeddings="
               f"{self.original_max_position_embeddings!r}, params={self.params!r}")
        return own + (f", asked={self.asked.to_text()!r})" if self.asked is not None else ")")

    def __post_init__(self) -> None:
        if self.asked is not None and not isinstance(self.asked, PosEncConfig):
            raise ValueError(f"asked must be the PosEncConfig a composition was computed from, got {self.asked!r}.")
        spec = resolve_method(self.method)
        self.method = spec.name
        factor = self.factor if self.factor is not None else spec.default_factor
        self.factor = check_factor(spec.name, factor, spec.uses_factor)
        if not isinstance(self.params, dict):
            raise ValueError(f"params must be a dict of the method's knobs, got {self.params!r}.")
        self.params = resolve_params(spec, self.factor, dict(self.params))
        omp = self.original_max_position_embeddings
        if omp is not None and (isinstance(omp, bool) or not isinstance(omp, int) or omp < MIN_ORIGINAL_CONTEXT):
            raise ValueError(f"original_max_position_embeddings must be an integer >= {MIN_ORIGINAL_CONTEXT} (the "
                             f"context the model was trained for), got {omp!r}.")

    @property
    def spec(self):
        return resolve_method(self.method)

    @classmethod
    def parse(cls, text: str) -> "PosEncConfig":
        """``PosEncConfig.parse("yarn:factor=4,beta_fast=16")``: the one text form of a configuration,
        ``METHOD[:KEY=VALUE,...]`` (see :mod:`hf_posenc.config_syntax`), read and checked as :meth:`patch
        <hf_posenc.patch>` checks a config; a bad one raises the one ValueError that names the text, the form and
        the method's keys."""
        method, knobs = split_spec(text)
        check_keys(text, method, list(knobs))
        factor, original = (knobs.pop(k, None) for k in FIELDS)
        return checked(text, method, factor, original, knobs)

    def to_text(self) -> str:
        """The configuration in the form :meth:`parse` reads: ``PosEncConfig.parse(c.to_text()) == c``."""
        return config_text(self.method, self.factor, self.original_max_position_embeddings, self.params)

    def __str__(self) -> str:
        return self.to_text()

    @classmethod
    def from_kwargs(cls, method: str, **kwargs: Any) -> "PosEncConfig":
        """``PosEncConfig.from_kwargs("yarn", factor=4, beta_fast=16)``: method knobs as keywords."""
        factor = kwargs.pop("factor", None)
        omp = kwargs.pop("original_max_position_embeddings", None)
        params = dict(kwargs.pop("params", None) or {})
        params.update(kwargs)
        return cls(method=method, factor=factor, original_max_position_embeddings=omp, params=params)

    def replace(self, **changes: Any) -> "PosEncConfig":
        data = self.to_dict()
        data.update(changes)
        return PosEncConfig.from_dict(data)

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "factor": self.factor,
            "original_max_position_embeddings": self.original_max_position_embeddings,
            "params": json.loads(json.dumps(self.params)),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], as_text: bool = False) -> "PosEncConfig":
        """The config of a dict (or of a stored block, checked as one); ``as_text``: a bad field refused by the one
        error of the text form (:func:`checked`), as a file the user wrote is (``--config FILE``)."""
        if not isinstance(data, dict) or "method" not in data:
            raise ValueError(f"a PosEncConfig dict needs at least a 'method' key, got {data!r}.")
        known = {"method", "factor", "original_max_position_embeddings", "params"}
        if set(data) & BLOCK_FIELDS:  # a checkpoint's stored block (or a copy of it): checked as one, field by field
            return SavedBlock.from_dict(data, "this configuration", as_text).config
        extra = sorted(set(data) - known)
        if extra:
            raise ValueError(f"unknown PosEncConfig field(s) {extra}; allowed: {sorted(known)}.")
        if as_text:
            return checked(fields_text(data), data["method"], data.get("factor"),
                           data.get("original_max_position_embeddings"), data.get("params", {}))
        return cls(**{k: data[k] for k in known if k in data})

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str, as_text: bool = False) -> "PosEncConfig":
        return cls.from_dict(json.loads(text), as_text)


def checked(text: str, method: Any, factor: Any, original_max_position_embeddings: Any, params: Any) -> PosEncConfig:
    """``PosEncConfig(...)``, a bad value refused by the one error of a method configuration, naming ``text``."""
    try:
        return PosEncConfig(method, factor, original_max_position_embeddings, params)
    except ValueError as err:
        raise config_error(text, err, method) from None


def as_config(method_or_config: Any, **kwargs: Any) -> PosEncConfig:
    """Accept a PosEncConfig, a dict, a method name plus keywords, or the text form ``METHOD:KEY=VALUE,...``
    (:meth:`PosEncConfig.parse`: ``patch(model, "yarn:factor=4")``)."""
    if isinstance(method_or_config, PosEncConfig):
        if kwargs:
            raise ValueError(f"pass either a PosEncConfig or keyword arguments, not both (got {sorted(kwargs)}).")
        return method_or_config
    if isinstance(method_or_config, dict):
        if kwargs:
            raise ValueError(f"pass either a config dict or keyword arguments, not both (got {sorted(kwargs)}).")
        return PosEncConfig.from_dict(method_or_config)
    if isinstance(method_or_config, str) and ":" in method_or_config:
        if kwargs:
            raise ValueError(f"pass either the text form {method_or_config!r} or keyword arguments, not both (got "
                             f"{sorted(kwargs)}).")
        return PosEncConfig.parse(method_or_config)
    return PosEncConfig.from_kwargs(method_or_config, **kwargs)



@dataclass
class SavedBlock:
    config: PosEncConfig
    family: str
    native: bool = False
    original: dict[str, Any] = field(default_factory=dict)
    version: str = __version__
    schema: int | None = None  # None: the one its content needs (PLAIN_SCHEMA, ASKED_SCHEMA or SCHEMA)

    def to_dict(self) -> dict[str, Any]:
        asked, pretrained = self.config.asked, self.config.pretrained_context
        schema = self.schema or (SCHEMA if pretrained is not None else ASKED_SCHEMA if asked is not None
                                 else PLAIN_SCHEMA)
        return {**self.config.to_dict(), "family": self.family, "native": self.native, "original": dict(self.original),
                **({"asked": asked.to_text()} if asked is not None else {}),
                **({"pretrained_context": pretrained} if pretrained is not None else {}), "version": self.version,
                "schema": schema}

    @classmethod
    def from_dict(cls, data: Any, source: str = "this checkpoint", as_text: bool = False) -> "SavedBlock":
        """The block read from ``source``'s config.json; a ValueError that names the checkpoint and the bad value
        (``as_text``: a bad configuration field by the one error of the text form, see ``PosEncConfig.from_dict``)."""
        where = f"{source}: the {CONFIG_KEY!r} block of its config.json"
        if not isinstance(data, dict):
            raise ValueError(f"{where} must be a JSON object, got {data!r}.")
        schema = data.get("schema", 1)
        if isinstance(schema, bool) or not isinstance(schema, int) or schema < 1:
            raise ValueError(f"{where} has schema={schema!r}; expected an integer from 1 to {SCHEMA}.")
        if schema > SCHEMA:
            raise ValueError(f"{where} has schema {schema} (written by hf_posenc {data.get('version')!r}); this "
                             f"hf_posenc ({__version__}) reads schemas up to {SCHEMA}. Upgrade hf_posenc to load it.")
        checks = {"version": str, "family": str, "native": bool, "original": dict}
        for key, kind in checks.items():
            if not isinstance(data.get(key), kind):
                raise ValueError(f"{where} has {key}={data.get(key)!r}; expected a {kind.__name__}. The file was "
                                 "edited or corrupted: save the checkpoint again from its base model.")
        unknown = sorted(set(data) - set(CONFIG_FIELDS) - set(checks)
                         - {"schema", "transformers4", "asked", "pretrained_context"})
        if unknown:
            raise ValueError(f"{where} has unknown field(s) {unknown}.")
        pretrained = data.get("pretrained_context")
        if pretrained is not None and (isinstance(pretrained, bool) or not isinstance(pretrained, int)
                                       or pretrained < MIN_ORIGINAL_CONTEXT):
            raise ValueError(f"{where} has pretrained_context={pretrained!r}; expected an integer >= "
                             f"{MIN_ORIGINAL_CONTEXT}. The file was edited or corrupted: save the checkpoint again "
                             "from its base model.")
        if data["family"] not in FAMILIES:
            raise ValueError(f"{where} names the family adapter {data['family']!r}, which this hf_posenc "
                             f"({__version__}; adapters: {FAMILIES}) does not have; upgrade hf_posenc, or save the "
                             "checkpoint again.")
        try:
            config = PosEncConfig.from_dict({k: data[k] for k in CONFIG_FIELDS if k in data}, as_text)
            if "asked" in data:
                if not isinstance(data["asked"], str):
                    raise ValueError(f"asked={data['asked']!r}: expected the text form of a configuration")
                config.asked = PosEncConfig.parse(data["asked"])
        except ValueError as err:
            raise ValueError(f"{where}: {err}") from None
        config.pretrained_context = pretrained
        return cls(config, data["family"], data["native"], dict(data["original"]), data["version"], schema)
