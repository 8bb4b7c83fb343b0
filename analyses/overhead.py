"""Table 3: the cost of RoPERelay in a complete request (prefill, selection, relocation, question, generation)."""

from relaylens.experiments import ExperimentSpec
from relaylens.presets import LLAMA, PAPER_DECODING, QWEN, SIX_SELECTORS, Preset

SPEC = ExperimentSpec(
    "overhead",
    selectors=("snapkv",),
    budgets=(0.10,),
    conditions=("original", "relay"),
    max_new_tokens=32,
    limit=4,
    figures=("table3",),
    description="Timing columns of original vs relay requests on the same cache; see also `relaylens bench overhead`.",
)

PRESETS = {"paper": Preset(
    dict(selectors=("bm25", "snapkv", "pyramidkv"), budgets=(2048, 8192), conditions=("original", "relay"),
         max_new_tokens=128, stop="none", prompt_mode="auto", granularity="session", limit=20),
    paper_model=f"{LLAMA}, BF16, SDPA, 4x RTX 3090", paper_data="LongMemEval-S 20, stratified by history length",
    metric="time, memory", notes="128 generation steps (no early stop); 3 repetitions: `relaylens bench overhead`.")}
