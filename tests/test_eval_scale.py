"""Evaluation at scale: labelled variants, resumable cells, several processes (torchrun / accelerate on CPU)."""

import json
import os
import subprocess
import sys

import pytest
from helpers import refused

from hf_posenc.cli import main
from hf_posenc.eval.variants import build_variants, parse_variant

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_variant_specs_parse_to_validated_configs():
    v = parse_variant("y4=yarn:factor=4,beta_fast=16")
    assert (v.label, v.method, v.config.factor, v.config.params["beta_fast"]) == ("y4", "yarn", 4.0, 16)
    lr = parse_variant("lr=longrope:factor=2,long_factor=[1.0,1.5],short_factor=[1.0,1.0]")
    assert lr.config.params["long_factor"] == [1.0, 1.5] and lr.config.params["short_factor"] == [1.0, 1.0]
    assert parse_variant("plain=none").config.method == "none"
    assert [v.label for v in build_variants(["none", "yarn"], 2.0, {}, ["y4=yarn:factor=4"])] == ["none", "yarn", "y4"]


@pytest.mark.parametrize("spec,message", [
    ("yarn", "--variant takes LABEL=METHOD[:KEY=VALUE,...]"),
    ("bad label=yarn:factor=2", "--variant takes LABEL=METHOD"),
    ("y=yran:factor=2", "--variant y: bad method configuration 'yran:factor=2': unknown method 'yran'"),
    ("y=yarn:factor=2,beta_fastt=3", "--variant y: bad method configuration 'yarn:factor=2,beta_fastt=3': method "
                                     "'yarn' does not take parameter(s) ['beta_fastt']"),
    ("y=yarn:factor=2,factor=3", "--variant y: bad method configuration 'yarn:factor=2,factor=3': factor given twice"),
    ("y=yarn:factor", "--variant y: bad method configuration 'yarn:factor': expected KEY=VALUE, got 'factor'"),
])
def test_bad_variants_are_refused_by_name(spec, message):
    with pytest.raises(ValueError) as err:
        parse_variant(spec)
    assert message in str(err.value)


def test_two_labels_may_not_name_one_variant(capsys):
    err = refused(["eval", "ppl", "--methods", "yarn", "--variant", "yarn=yarn:factor=4"], capsys)
    assert "the label 'yarn' names two variants" in err


def test_one_method_compared_with_itself_is_keyed_by_label(tiny_checkpoint, tmp_path, capsys):
    out = tmp_path / "v"
    assert main(["eval", "ppl", "--model", tiny_checkpoint, "--methods", "none", "--variant", "y2=yarn:factor=2",
                 "--variant", "y4=yarn:factor=4,beta_fast=16", "--lengths", "32,64", "--max-windows", "2",
                 "--corpus", "python-docs", "--output", str(out), "--no-progress"]) == 0
    table = capsys.readouterr().out
    assert "| none |" in table and "| y2 |" in table and "| y4 |" in table
    report = json.loads((out / "perplexity.json").read_text())
    assert list(report["results"]) == ["none", "y2", "y4"]
    assert (report["setup"]["variants"]["y4"]["factor"] == 4.0
            and report["setup"]["variants"]["y4"]["params"]["beta_fast"] == 16)
    assert report["results"]["y2"]["64"]["ppl"] != report["results"]["y4"]["64"]["ppl"]
    assert (out / "ppl_vs_length.png").exists()


def _passkey(checkpoint, out, *extra):
    return ["eval", "passkey", "--model", checkpoint, "--methods", "none,yarn", "--lengths", "64,96", "--depths",
            "0.2,0.8", "--trials", "2", "--output", str(out), "--no-progress", "--no-plots", *extra]


def _stable(report):
    """A report without what differs between two runs of one command (timings, processes, the command)."""
    drop = ("seconds", "compute", "environment", "processes", "command")
    return {**report, "setup": {k: v for k, v in report["setup"].items() if k not in drop}}


def test_a_killed_run_resumes_where_it_stopped_and_gives_the_same_report(tiny_checkpoint, tmp_path, capsys,
                                                                         monkeypatch):
    import hf_posenc.eval.run_passkey as run_passkey

    whole, cut = tmp_path / "whole", tmp_path / "cut"
    assert main(_passkey(tiny_checkpoint, whole)) == 0
    assert main(_passkey(tiny_checkpoint, cut)) == 0
    lines = (cut / "cells.jsonl").read_text().splitlines(keepends=True)
    assert len(lines) == 1 + 2 * 4  # the setup, then 2 variants x 2 lengths x 2 depths
    # killed while writing the fourth cell: three whole cells and half a line survive, no report yet; the
    # first cell was written by a release that recorded no seconds nor device, the second on a GPU machine
    old, other = json.loads(lines[1]), json.loads(lines[2])
    assert old["device"] == other["device"] == "cpu"
    del old["seconds"], old["device"]
    other["device"] = "cuda (NVIDIA H100 80GB HBM3)"
    lines[1], lines[2] = json.dumps(old) + "\n", json.dumps(other) + "\n"
    (cut / "cells.jsonl").write_text("".join(lines[:4]) + lines[4][: len(lines[4]) // 2])
    (cut / "passkey.json").unlink()
    capsys.readouterr()
    computed = []
    real = run_passkey.passkey_cell
    monkeypatch.setattr(run_passkey, "passkey_cell", lambda *a, **k: computed.append(a[3:5]) or real(*a, **k))
    assert main(_passkey(tiny_checkpoint, cut)) == 0
    assert "resumed 3 of 8 cells" in capsys.readouterr().err and len(computed) == 5
    resumed, once = (json.loads((d / "passkey.json").read_text()) for d in (cut, whole))
    assert _stable(resumed) == {**_stable(once), "table": once["table"] + (  # the cells' devices said under the table
        "\n\nCells computed: 6 on cpu, 1 on cuda (NVIDIA H100 80GB HBM3), 1 not recorded; this call ran on cpu.")}
    # the cost of the cells over both calls, the untimed one said, not counted as zero
    for folder, report, untimed in ((cut, resumed, 1), (whole, once, 0)):
        kept = [json.loads(line) for line in (folder / "cells.jsonl").read_text().splitlines()[1:]
                if line.endswith("}")]
        assert report["setup"]["compute"]["seconds"] == pytest.approx(sum(c.get("seconds", 0) for c in kept), abs=1e-3)
        assert {k: report["setup"]["compute"][k] for k in ("cells", "untimed")} == {"cells": 8, "untimed": untimed}
    # and where each cell was computed, whichever call computed it
    assert resumed["setup"]["compute"]["devices"] == {"cpu": 6, "cuda (NVIDIA H100 80GB HBM3)": 1, "not recorded": 1}
    assert once["setup"]["compute"]["devices"] == {"cpu": 8}
    capsys.readouterr()
    assert main(_passkey(tiny_checkpoint, cut)) == 0 and len(computed) == 5  # all done: nothing computed again
    assert "resumed 8 of 8 cells" in capsys.readouterr().err


def test_another_setup_in_the_same_folder_is_refused_unless_overwrite(tiny_checkpoint, tmp_path, capsys):
    out = tmp_path / "o"
    assert main(_passkey(tiny_checkpoint, out)) == 0
    err = refused(_passkey(tiny_checkpoint, out, "--digits", "4"), capsys)
    assert "holds the cells of another setup (settings.digits: 5 -> 4)" in err and "--overwrite" in err
    assert main(_passkey(tiny_checkpoint, out, "--digits", "4", "--overwrite")) == 0
    assert json.loads((out / "passkey.json").read_text())["setup"]["digits"] == 4
    base = ["eval", "ppl", "--model", tiny_checkpoint, "--lengths", "32", "--max-windows", "1", "--corpus",
            "python-docs", "--output", str(tmp_path / "p"), "--no-progress", "--no-plots"]
    assert main(base + ["--variant", "y=yarn:factor=2"]) == 0
    err = refused(base + ["--variant", "y=yarn:factor=3"], capsys)
    assert "variant 'y' is" in err and "factor: 2.0 -> 3.0" in err
    assert main(base + ["--variant", "y=yarn:factor=2", "--variant", "y3=yarn:factor=3"]) == 0  # a new label: fine


def _free_port() -> str:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return str(sock.getsockname()[1])


def _launch(launcher: list[str], argv: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    port = ["--master_port" if "torch" in launcher[0] else "--main_process_port", _free_port()]
    return subprocess.run([sys.executable, "-m", *launcher, *port, "-m", "hf_posenc", *argv], capture_output=True,
                          text=True, env=env, timeout=600, cwd=ROOT)


@pytest.mark.parametrize("launcher", [
    ["torch.distributed.run", "--nproc_per_node", "2"],
    ["accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
     "--mixed_precision", "no", "--dynamo_backend", "no"],
], ids=["torchrun", "accelerate"])
def test_two_processes_give_the_single_process_numbers(launcher, tiny_checkpoint, tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    ppl = ["eval", "ppl", "--model", tiny_checkpoint, "--methods", "none", "--variant", "y4=yarn:factor=4",
           "--lengths", "32,64", "--max-windows", "3", "--corpus", "python-docs", "--no-progress", "--no-plots"]
    assert main(ppl + ["--output", str(one / "ppl")]) == 0
    assert main(_passkey(tiny_checkpoint, one / "passkey")) == 0
    for argv in (ppl + ["--output", str(two / "ppl")], _passkey(tiny_checkpoint, two / "passkey")):
        res = _launch(launcher, argv)
        assert res.returncode == 0, res.stderr[-3000:]
        assert res.stdout.count("| none |") == 1  # one process prints (and writes) the report
    for task, stem in (("ppl", "perplexity"), ("passkey", "passkey")):
        single = json.loads((one / task / f"{stem}.json").read_text())
        double = json.loads((two / task / f"{stem}.json").read_text())
        assert double["setup"]["processes"] == 2 and single["setup"]["processes"] == 1
        assert _stable(double) == _stable(single)
    cells = [json.loads(x) for x in (two / "ppl" / "cells.jsonl").read_text().splitlines()]
    keys = [json.dumps([c["variant"], c["key"]]) for c in cells[1:]]
    assert len(keys) == len(set(keys))  # every cell computed by exactly one process


def test_device_map_loads_through_accelerate_and_gives_the_same_numbers(tiny_checkpoint, tmp_path, capsys):
    base = ["eval", "ppl", "--model", tiny_checkpoint, "--methods", "none,yarn", "--lengths", "32",
            "--max-windows", "2", "--corpus", "python-docs", "--no-progress", "--no-plots"]
    assert main(base + ["--output", str(tmp_path / "plain")]) == 0
    assert main(base + ["--device-map", "auto", "--max-memory", "cpu=2GiB", "--output", str(tmp_path / "mapped")]) == 0
    plain, mapped = (json.loads((tmp_path / f / "perplexity.json").read_text()) for f in ("plain", "mapped"))
    assert plain["results"] == mapped["results"]
    err = refused(base + ["--max-memory", "cpu=2GiB"], capsys)
    assert "--max-memory sets how much of each device --device-map may use; add --device-map auto" in err
