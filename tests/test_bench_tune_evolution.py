"""scripts/bench_tune_evolution.py's verdicts: each names the YaRN variant of its target (yarn-x2 at 16,384, not
12,288's yarn-x1.5), the depths measured and the needles past truncation's reach."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "scripts"))

import bench_tune_evolution as bench  # noqa: E402


def _row(accuracy: float, hits: int) -> dict:
    return {"accuracy": accuracy, "beyond_reach": {"16384": {"hits": hits, "trials": 10, "accuracy": hits / 10}}}


def test_passkey_verdict_names_the_targets_yarn_and_the_far_needles():
    report = {"setup": {"depths": [0.1, 0.3]},
              "results": {"none": _row(0.0, 0), "searched": _row(0.1, 1), "yarn-x2": _row(0.2, 2),
                          "self_extend": _row(0.7, 7)}}
    said = bench._passkey_verdict(report, "yarn-x2")
    assert "depths 0.1, 0.3" in said
    assert "no better than YaRN (0.20)" in said
    assert "best method here is self_extend (0.70)" in said
    assert "searched 1 of 10, YaRN 2 of 10, none 0, self_extend 7." in said
    assert bench._passkey_verdict(report, "yarn-x1.5") == ""


def test_ppl_verdict_reads_the_targets_yarn():
    results = {"none": {"8192": {"ppl": 25.18}}, "none-truncated": {"16384": {"past_original": {"ppl": 29.96},
                                                                             "context_gain": 1.0}},
               "searched": {"8192": {"ppl": 25.27}, "16384": {"past_original": {"ppl": 31.2}, "context_gain": 0.96}},
               "yarn-x2": {"8192": {"ppl": 25.83}, "16384": {"past_original": {"ppl": 31.09}, "context_gain": 0.964}}}
    said = bench._ppl_verdict(results, "16384", "yarn-x2")
    assert "YaRN 31.09" in said and "YaRN 25.83" in said and "nan" not in said
    assert "no method beats truncating" in said


def test_no_run_records_each_steps_command_and_runs_none(monkeypatch):
    ran = []
    monkeypatch.setattr(bench, "run_cli", lambda argv, no_progress=False: ran.append(argv))
    monkeypatch.setattr(bench, "run_needles_far_first", lambda *a: ran.append(a))
    args = bench.build_parser().parse_args(["--no-run"])
    lines = []
    bench.step(args, "ppl", ["eval", "ppl"], lines)
    bench.step(args, "passkey", ["eval", "passkey", "--depths", "0.1"], lines, 16384)
    assert ran == [] and lines == ["- ppl: `hf-posenc eval ppl`", "- passkey: `hf-posenc eval passkey --depths 0.1`"]
    bench.step(bench.build_parser().parse_args([]), "ppl", ["eval", "ppl"], lines)
    assert ran == [["eval", "ppl"]]


def test_pending_names_the_depths_the_report_lacks(tmp_path):
    (tmp_path / "passkey").mkdir()
    (tmp_path / "passkey" / "passkey.json").write_text('{"setup": {"depths": [0.1, 0.3]}}')
    assert bench._pending(str(tmp_path), "0.1,0.3,0.5,0.7,0.9")[0].startswith("Needles at depths 0.5, 0.7, 0.9")
    assert bench._pending(str(tmp_path), "0.1,0.3") == []
    assert bench._pending(str(tmp_path / "none"), "0.1") == []
