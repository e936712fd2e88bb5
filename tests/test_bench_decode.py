"""`jaxformer bench decode` at toy sizes: what it reports (not how fast anything is)."""

import json
import statistics

import pytest
import yaml
from model_helpers import TINY

from jaxformer import cli
from jaxformer.train.peak import cpu_model


@pytest.mark.slow
def test_bench_decode_reports_latencies_speedups_and_cache_bytes(tmp_path, capsys, monkeypatch):
    from jaxformer.benchmarks import decode

    drawn, save_figure = [], decode.save_figure

    def read_then_save(fig, axes, path):  # what the figure draws, read as it is saved (the real save follows)
        drawn.extend((list(line.get_xdata()), list(line.get_ydata())) for line in axes[0].lines)
        save_figure(fig, axes, path)

    monkeypatch.setattr(decode, "save_figure", read_then_save)
    (tmp_path / "model.yaml").write_text(yaml.safe_dump({"model": {**TINY, "position": "rope"}}))
    code = cli.main(["bench", "decode", str(tmp_path / "model.yaml"), "--out", str(tmp_path), "--tokens", "4",
                     "--prompt-len", "3", "--repeats", "1", "--window", "2"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "speedup at token 4:" in printed and "(equal)" in printed
    report = json.loads((tmp_path / "decode.json").read_text())
    assert report["points"] == [1, 2, 4] and len(report["cached_s"]) == 4
    assert all(r["speedup"] == pytest.approx(r["uncached_ms"] / r["cached_ms"]) for r in report["rows"])
    # token t's cached latency: the median of the cached steps t - 1 and t (--window 2), steps counted from 1
    windows = [report["cached_s"][0:1], report["cached_s"][0:2], report["cached_s"][2:4]]
    assert [r["t"] for r in report["rows"]] == [1, 2, 4]
    assert [r["cached_ms"] for r in report["rows"]] == [pytest.approx(statistics.median(w) * 1e3, rel=1e-12)
                                                        for w in windows]
    last = report["rows"][-1]
    assert report["speedup_at_last_token"] == last["speedup"] and f"speedup at token 4: {last['speedup']:.1f}x" in printed
    # 1 layer · 2 (K and V) · 2 kv heads · head_dim 8 · 7 positions · 4 bytes
    assert report["cache_bytes"] == report["cache_bytes_formula"] == 2 * 2 * 8 * 7 * 4
    assert (tmp_path / "decode.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert drawn == [([1, 2, 3, 4], [s * 1e3 for s in report["cached_s"]]),  # every cached step, in ms
                     ([1, 2, 4], [r["cached_ms"] for r in report["rows"]]),  # the rows' windows
                     ([1, 2, 4], [r["uncached_ms"] for r in report["rows"]])]
    assert report["machine"]["cpu_model"] == cpu_model() and cpu_model() in printed  # the environment, as train's


def test_bench_decode_refuses_an_encoder(tmp_path, capsys):
    assert cli.main(["bench", "decode", "--preset", "bert-base", "--out", str(tmp_path)]) == 2
    message = "bench decode needs a decoder model, got model.family 'encoder'"
    assert capsys.readouterr().err == f"jaxformer bench: error: {message}\n"
