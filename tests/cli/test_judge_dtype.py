"""``relaylens judge --dtype``: a local judge loads in the dtype asked for (float32 by default), a bad dtype is one
clear line before any model loads, and ``--dtype`` with ``--judge-url`` is refused (the server owns its dtype)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from relaylens.cli import app
from relaylens.errors import RelaylensError


def _judge(tmp_path, *extra):
    return CliRunner().invoke(app, ["judge", str(tmp_path), *extra], env={"COLUMNS": "200", "HF_HUB_OFFLINE": "1"})


@pytest.mark.parametrize(("extra", "expected"), [((), "float32"), (("--dtype", "bfloat16"), "bfloat16")])
def test_local_judge_loads_in_the_dtype_asked_for(tmp_path, monkeypatch, extra, expected):
    import relaylens.model.loading as loading

    seen = {}

    def fake_load(spec, dtype=None, **kwargs):
        seen.update(spec=spec, dtype=dtype)
        raise RelaylensError("stopped after recording the dtype")

    monkeypatch.setattr(loading, "load_model", fake_load)
    result = _judge(tmp_path, "--judge-model", "qwen2.5-coder-1.5b-instruct", *extra)
    assert result.exit_code == 2 and "stopped after recording the dtype" in result.output
    assert seen == {"spec": "qwen2.5-coder-1.5b-instruct", "dtype": expected}


def test_bad_dtype_and_dtype_with_an_endpoint_are_one_clear_line(tmp_path):
    bad = _judge(tmp_path, "--judge-model", str(tmp_path / "no-such-model"), "--dtype", "float8")
    lines = [line for line in bad.output.splitlines() if line.startswith("error:")]
    assert bad.exit_code == 2 and len(lines) == 1 and "float8" in lines[0], bad.output
    remote = _judge(tmp_path, "--judge-url", "http://127.0.0.1:9/v1", "--judge-model", "m", "--dtype", "bfloat16")
    lines = [line for line in remote.output.splitlines() if line.startswith("error:")]
    assert (remote.exit_code == 2 and len(lines) == 1 and "--dtype" in lines[0]
            and "--judge-url" in lines[0]), remote.output


@pytest.mark.parametrize(("flags", "upcast"), [("fpu avx2", True), ("fpu avx512_bf16", False)])
def test_a_bfloat16_local_judge_computes_its_products_in_float32_where_the_cpu_lacks_bfloat16(tmp_path, monkeypatch,
                                                                                              flags, upcast):
    import types

    import torch

    import relaylens.experiments.rejudge as rejudge
    import relaylens.model.loading as loading
    from relaylens.testing import tiny_model, tiny_tokenizer

    monkeypatch.setenv("RELAYLENS_CPU_FLAGS", flags)
    monkeypatch.setattr(loading, "load_model", lambda spec, dtype=None, **kw: (tiny_model("llama", dtype=dtype),
                                                                               tiny_tokenizer()))
    depth = torch._C._len_torch_function_stack()
    seen = []

    def fake_rejudge(run_dir, backend, name, data=None, progress=None, template=None):
        seen.append(torch._C._len_torch_function_stack() - depth)
        return types.SimpleNamespace(judged=0, calls=0, cache_hits=0, failures=[], metrics=[])

    monkeypatch.setattr(rejudge, "rejudge_run", fake_rejudge)
    result = _judge(tmp_path, "--judge-model", "tiny", "--dtype", "bfloat16")
    assert result.exit_code == 0, result.output
    assert seen == [1 if upcast else 0] and torch._C._len_torch_function_stack() == depth
