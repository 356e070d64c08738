"""The ``hf_posenc`` block that a patched checkpoint's ``config.json`` holds: what was applied (a PosEncConfig),
by which family adapter, whether plain transformers rebuilds it (``native``), the config fields the patch
changed as they were (``original``), and which hf_posenc wrote it (``version``, ``schema``).

Schema 1: hf_posenc 0.1.0 (no ``schema`` key). Schema 2: the same fields plus ``schema``. A reader takes every
schema up to its own and refuses a newer one, naming it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ._version import __version__
from .config import CONFIG_KEY, PosEncConfig

SCHEMA = 2
CONFIG_FIELDS = ("method", "factor", "original_max_position_embeddings", "params")


@dataclass
class SavedBlock:
    config: PosEncConfig
    family: str
    native: bool = False
    original: dict[str, Any] = field(default_factory=dict)
    version: str = __version__
    schema: int = SCHEMA

    def to_dict(self) -> dict[str, Any]:
        return {**self.config.to_dict(), "family": self.family, "native": self.native, "original": dict(self.original),
                "version": self.version, "schema": self.schema}

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
            raise ValueError(f"{where} has schema {schema} (written by hf_posenc {data.get('version')!r}); this hf_posenc "
                             f"({__version__}) reads schemas up to {SCHEMA}. Upgrade hf_posenc to load it.")
        checks = {"version": str, "family": str, "native": bool, "original": dict}
        for key, kind in checks.items():
            if not isinstance(data.get(key), kind):
                raise ValueError(f"{where} has {key}={data.get(key)!r}; expected a {kind.__name__}. The file was edited or "
                                 "corrupted: save the checkpoint again from its base model.")
        unknown = sorted(set(data) - set(CONFIG_FIELDS) - set(checks) - {"schema"})
        if unknown:
            raise ValueError(f"{where} has unknown field(s) {unknown}.")
        from .adapters import ADAPTERS

        families = [a.name for a in ADAPTERS]
        if data["family"] not in families:
            raise ValueError(f"{where} names the family adapter {data['family']!r}, which this hf_posenc ({__version__}; "
                             f"adapters: {families}) does not have; upgrade hf_posenc, or save the checkpoint again.")
        try:
            config = PosEncConfig.from_dict({k: data[k] for k in CONFIG_FIELDS if k in data}, as_text)
        except ValueError as err:
            raise ValueError(f"{where}: {err}") from None
        return cls(config, data["family"], data["native"], dict(data["original"]), data["version"], schema)
