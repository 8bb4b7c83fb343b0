"""Tables 10-11: long-form summarization (HelloBench) under SnapKV at 10% of the source text, original vs RoPERelay
coordinates vs FullKV, judged with HelloEval checklists.

The task instruction and the chat template are protected (``protect_instructions``,
:mod:`relaylens.selectors.protection`): every selector keeps them and the 10% budget applies to the source text only.
Decoding is greedy up to ``max_new_tokens`` (8,192, the paper's limit; no minimum, no truncation) and stops at EOS; the
answers table records each summary's length and whether it ended with EOS. The judge (``--judge-url/--judge-model``, or
``--judge-model stub`` for the deterministic local stub) scores every checklist item; Table 10 gives the quality /
factuality / coverage means, the mean generated length and the EOS rate per setting, Table 11 the means per source
category.

The CPU default runs the bundled HelloBench-format sample (ten generated items, two per category, ~700 and ~1,400
words) with SmolLM2. The 8,192-token default does not fit SmolLM2's 8,192-position range together with the source,
so such records are skipped and listed; the CPU demo passes a small limit:
``relaylens run summarization --limit 2 --max-new-tokens 64 --judge-model stub``.
"""

from relaylens.experiments.analysis import Analysis
from relaylens.experiments.presets import LLAMA, Preset
from relaylens.experiments.specs import ExperimentSpec

SPEC = ExperimentSpec(
    "summarization",
    selectors=("snapkv", "full"),
    budgets=(0.10,),
    conditions=("original", "relay"),
    max_new_tokens=8192,
    prompt_mode="auto",
    stop="eos",
    limit=4,
    figures=("table10", "table11"),
    description="HelloBench summarization: SnapKV 10% of the source text (instructions protected), original vs "
                "RoPERelay vs FullKV, HelloEval checklist judging.",
    data="sample:hellobench",
    protect_instructions=True,
)

PRESETS = {"paper": Preset(
    dict(selectors=("snapkv", "full"), budgets=(0.10,), conditions=("original", "relay"), selector_options={}, limit=0,
         max_new_tokens=8192, stop="eos", prompt_mode="auto", protect_instructions=True),
    paper_model=LLAMA,
    paper_data="HelloBench summarization, 24 items (blogs, reports, news, long dialogues, academic articles; sources "
               "4,096-11,046 tokens, two length strata of 12)",
    metric="HelloEval checklists by the judge: quality, factuality, coverage (0-1), per category",
    notes="SnapKV at 10% of the source text, instruction and template tokens kept and counted separately; greedy "
          "decoding up to 8,192 tokens, stop at EOS, no minimum length, no truncation.")}

ANALYSIS = Analysis(SPEC, PRESETS, doc=__doc__)
