"""An eval task added from outside the package, as a plugin would: the perplexity of a text's first tokens. One
``Params`` dataclass, one runner and one :class:`hf_posenc.eval.tasks.EvalTask` record (registered by the test that
uses it: :func:`hf_posenc.eval.tasks.register_task`)."""

import math
from dataclasses import dataclass

from hf_posenc.eval.cells import NUMBER
from hf_posenc.eval.common import Run
from hf_posenc.eval.params import ints, param
from hf_posenc.eval.scoring import token_nll
from hf_posenc.eval.tasks import Defaults, EvalTask, PatchUse, per_length_entries
from hf_posenc.io.reports import markdown_table

TEXT = "the quick brown fox jumps over the lazy dog. " * 40


@dataclass(frozen=True)
class PrefixParams:
    lengths: list[int] = param([16, 32], "prefix lengths in tokens.", read=ints)
    text: str = param(TEXT, "the text whose first tokens are scored.")


def run_prefix_nll(settings, params: PrefixParams) -> dict:
    """The toy task: per length, the mean NLL of the first ``length`` tokens of ``text``, one cell per length."""
    lengths = params.lengths
    with Run(settings) as job:
        _, tok, _ = job.load()
        ids = tok(params.text, return_tensors="pt").input_ids[0]
        if max(lengths) > len(ids):
            raise ValueError(f"--lengths: the text has {len(ids)} tokens, got {max(lengths)}")
        keys = [[n] for n in lengths]

        def compute(variant, key):
            model = job.model_for(variant, max(lengths))
            return {"nll": token_nll(model, ids[None, : key[0]])[0].mean().item()}

        done = job.cells("prefix_nll", {"text": params.text}, {v.label: keys for v in job.variants}, compute,
                         fields={"nll": NUMBER})
        results = {label: {str(k[0]): math.exp(c["nll"]) for k, c in zip(keys, cells)} for label, cells in done.items()}
        return job.report("prefix_nll", {"lengths": lengths}, results, prefix_table, None)


def prefix_table(report) -> str:
    lengths = report["setup"]["lengths"]
    rows = [[label, *(r[str(n)] for n in lengths)] for label, r in report["results"].items()]
    return "Prefix perplexity.\n\n" + markdown_table(["method", *(f"{n} tokens" for n in lengths)], rows)


PREFIX = EvalTask(
    name="prefix_nll", report="prefix_nll", summary="perplexity of the text's first tokens (a test task).",
    title="Prefix perplexity (test task)", params=PrefixParams, run=run_prefix_nll,
    defaults=Defaults(methods=("none", "pi")),
    model_index=per_length_entries(dict(task_type="text-generation", task_name="Prefix perplexity",
                                        dataset_type="text", dataset_name="fox", metric_type="perplexity"),
                                   "prefix perplexity @ {n} tokens", lambda res, n: res.get(n)),
    patch=PatchUse(lambda e: PrefixParams(lengths=[16, 32])))
