"""The site's planner (lessons/assets/calculator/planner.js) against fsdp_mini.course.planner, without a browser.

A quick check for whoever changes the planner's formulas: it runs the JavaScript port in Node.js (skipped where
`node` is absent) on the same presets and constants the page gets (`planner_site.site_data()`) and compares
every number of `plan` and of `compare`, bit for bit. The browser tests in test_site.py check the page itself.
"""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CASES = [
    ("llama3-8b", "a100-80gb", dict(gpus=64, seq=8192, local_batch=1, ac="selective-layer")),
    ("llama3-8b", "h100-96gb", dict(gpus=64, seq=8192, local_batch=12, ac="selective-op", tp=8, sp=True, compile=True,
                                    float8=True, compile_loss=True)),
    ("llama3-70b", "h100-sxm", dict(gpus=256, seq=8192, local_batch=2, ac="full", tp=8)),
    ("llama2-13b", "a100-80gb", dict(gpus=64, seq=4096, local_batch=2, ac="none")),
    ("llama3-70b", "h200", dict(gpus=128, seq=32768, local_batch=1, ac="full", tp=8, sp=True, cp=4)),
    ("llama2-7b", "h100-sxm", dict(gpus=64, seq=4096, local_batch=4, dp_replicate=4, micro_batches=2, ac="selective-op")),
    ("gpt2-xl", "a100-80gb", dict(gpus=8, seq=1024, local_batch=16, micro_batches=4, compile=True)),
    ("gpt2", "h100-sxm", dict(gpus=2, seq=1024, local_batch=8, tp=2, sp=True, gpus_per_node=2, ac="selective-op")),
    ("llama3-405b", "h100-sxm", dict(gpus=512, seq=8192, local_batch=1, tp=8, sp=True, cp=2, dp_replicate=2, ac="full",
                                     float8=True)),
    ("gpt2-medium", "h200", dict(gpus=16, seq=2048, local_batch=4, cp=2, gpus_per_node=4, ac="selective-layer")),
    ("llama3-8b", "h100-sxm", dict(gpus=16, seq=8192, local_batch=3, cp=2, dp_replicate=2, ac="none")),
    ("llama3-8b", "a100-80gb", dict(gpus=8, seq=8192, local_batch=4, tp=2, ac="none")),
    ("llama3-70b", "h100-sxm", dict(gpus=64, seq=8192, local_batch=8, micro_batches=8, tp=8, sp=True,
                                    sp_variant="megatron", ac="none")),
    ("llama3-70b", "h100-sxm", dict(gpus=64, seq=32768, local_batch=8, micro_batches=8, no_sync=True, tp=8, sp=True,
                                    tp_overlap=True, ac="full")),
    ("gpt2-medium", "h100-sxm", dict(gpus=8, seq=1024, local_batch=8, tp=4, sp=True, sp_variant="megatron",
                                     tp_overlap=True, ac="none")),
    ("llama3-8b", "a100-80gb", dict(gpus=16, seq=8192, local_batch=2, tp=2, tp_overlap=True, ac="selective-op")),
    ("llama2-7b", "a100-80gb", dict(gpus=16, seq=4096, local_batch=4, micro_batches=2, no_sync=True,
                                    dp_replicate=2, ac="selective-op")),
    ("gpt2-medium", "a100-80gb", dict(gpus=16, seq=1024, local_batch=8, tp=4, sp=True, sp_variant="megatron",
                                      ac="selective-op")),
]
RANKED = 12
"""Cases whose `compare` is compared too (the first ones): the others add a switch that `compare` searches anyway."""
RUN = r"""
const core = require(process.argv[2]);
const input = JSON.parse(require('fs').readFileSync(0, 'utf8'));
const P = core.makePlanner(input.data);
const out = input.cases.map(([m, g, kw], i) => {
  const model = P.getModel(m), gpu = P.getGpu(g), layout = P.layout(kw);
  return {plan: P.toDict(P.plan(model, gpu, layout)),
          ranked: i >= input.ranked ? [] :
            P.compare(model, gpu, layout).map(c => [c.rank, P.describe(c.plan.layout), P.toDict(c.plan)])};
});
process.stdout.write(JSON.stringify(out));
"""


def test_port_equals_python(tmp_path):
    node = shutil.which("node")
    if node is None:
        pytest.skip("no node: the browser tests in test_site.py check the port")
    from fsdp_mini.course.planner import Layout, get_gpu, get_model, plan
    from fsdp_mini.course.planner.compare import compare, describe
    from fsdp_mini.course.planner_site import site_data

    script = tmp_path / "run.js"
    script.write_text(RUN)
    done = subprocess.run([node, str(script), str(ROOT / "lessons/assets/calculator/planner.js")], capture_output=True,
                          text=True, input=json.dumps({"data": site_data(), "cases": CASES, "ranked": RANKED}), timeout=120)
    assert done.returncode == 0, done.stderr
    for i, ((m, g, kw), got) in enumerate(zip(CASES, json.loads(done.stdout), strict=True)):
        model, gpu, layout = get_model(m), get_gpu(g), Layout(**kw)
        assert got["plan"] == plan(model, gpu, layout).to_dict(), (m, kw)
        expected = [] if i >= RANKED else [[c.rank, describe(c.plan.layout), c.plan.to_dict()]
                                           for c in compare(model, gpu, layout)]
        assert got["ranked"] == expected, (m, kw)
