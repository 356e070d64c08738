import json
import math

import pytest

import hf_posenc
from hf_posenc import PosEncConfig


def test_round_trip_fills_defaults():
    cfg = PosEncConfig("YaRN", factor=4, params={"beta_fast": 16})
    assert cfg.method == "yarn" and cfg.factor == 4.0
    assert cfg.params["beta_fast"] == 16 and cfg.params["beta_slow"] == 1.0 and cfg.params["truncate"] is True
    again = PosEncConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert again == cfg
    assert PosEncConfig.from_json(cfg.to_json()) == cfg


@pytest.mark.parametrize("alias,canonical",
                         [("linear", "pi"), ("dynamic", "dynamic_ntk"), ("Dynamic-NTK", "dynamic_ntk")])
def test_aliases(alias, canonical):
    assert PosEncConfig(alias, factor=2).method == canonical


def test_list_methods_names_families():
    methods = hf_posenc.list_methods()
    for name in ("none", "pi", "ntk", "dynamic_ntk", "yarn", "dynamic_yarn", "llama3", "longrope"):
        assert name in methods
        assert set(methods[name]["families"]) >= {"llama", "qwen2", "qwen3", "mistral"}
    assert "linear" in methods["pi"]["aliases"] and "dynamic" in methods["dynamic_ntk"]["aliases"]
    assert methods["yarn"]["params"]["beta_fast"] == 32.0


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        (dict(method="yran", factor=2), "Did you mean 'yarn'"),
        (dict(method="yarn", factor=0.5), "factor must be a number from 1 to 1024, got 0.5"),
        (dict(method="yarn", factor=math.inf), "got inf"),
        (dict(method="pi", factor="2"), "factor must be a number"),
        (dict(method="yarn"), "needs a factor"),
        (dict(method="none", factor=3.0), "takes no factor"),
        (dict(method="yarn", factor=2, params={"beta_fats": 3}), "does not take parameter(s) ['beta_fats']"),
        (dict(method="yarn", factor=2, params={"beta_fast": 1, "beta_slow": 2}), "beta_fast must be greater"),
        (dict(method="llama3", factor=2, params={"low_freq_factor": 4, "high_freq_factor": 1}),
         "high_freq_factor must be greater"),
        (dict(method="longrope", factor=2, params={"long_factor": []}), "long_factor must be a non-empty list"),
        (dict(method="pi", factor=2, original_max_position_embeddings=0),
         "original_max_position_embeddings must be an integer >= 16"),
        (dict(method="longrope", factor=2, original_max_position_embeddings=1),
         "must be an integer >= 16 (the context the model was trained for), got 1"),
        (dict(method="yarn", factor=1e300), "factor must be a number from 1 to 1024, got 1e+300"),
        (dict(method="yarn", factor=1e308), "factor must be a number from 1 to 1024, got 1e+308"),
        (dict(method="pi", factor=2, original_max_position_embeddings=12.5),
         "must be an integer >= 16 (the context the model was trained for), got 12.5"),
    ],
)
def test_bad_configs_name_the_value(kwargs, needle):
    with pytest.raises(ValueError) as err:
        PosEncConfig(**kwargs)
    assert needle in str(err.value)


def test_from_dict_rejects_unknown_fields():
    with pytest.raises(ValueError, match="unknown PosEncConfig field"):
        PosEncConfig.from_dict({"method": "pi", "factor": 2, "scale": 3})
