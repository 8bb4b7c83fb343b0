"""Which part of the framing matters (beyond the paper): the instruction and chat-template framing kept on top of the
budget cell by cell, under original and relay.

Every cell keeps the selector's states within the same source budget (the ratio of the tokens inside the sessions)
and adds its own kept set (:data:`relaylens.selectors.protection.FRAMING_CELLS`): nothing (the framing evicted), the
first 1 or 4 tokens (the attention sink), the instruction, the chat template's head, the session headers, all the
framing (the default protected set), or the framing and the headers. The ``framing_table`` reports accuracy, the
empty-answer rate, the first-token end-of-answer probability and the hit-limit rate per cell, paired.
"""

from relaylens.experiments.analysis import Analysis
from relaylens.experiments.presets import LLAMA, PAPER_DECODING, QWEN, Preset
from relaylens.experiments.specs import ExperimentSpec
from relaylens.selectors.protection import FRAMING_CELLS

SPEC = ExperimentSpec(
    "framing",
    selectors=("bm25",),
    budgets=(0.10,),
    conditions=("original", "relay"),
    framing_cells=FRAMING_CELLS,
    limit=8,
    figures=("framing", "framing_table", "answering"),
    description="The framing kept on top of the budget cell by cell (nothing / first 1 or 4 tokens / instruction / "
    "template head / session headers / all framing / framing and headers), original vs relay: accuracy, empty "
    "answers, first-token end-of-answer probability, hit-limit rate.",
)

PRESETS = {"paper": Preset(
    dict(selectors=("bm25",), budgets=(0.10,), conditions=("original", "relay"), framing_cells=FRAMING_CELLS, limit=0,
         **PAPER_DECODING),
    paper_model=f"not in the paper; its models: {LLAMA}; {QWEN}",
    paper_data="LongMemEval-S (not in the paper)",
    notes="Not an experiment of the paper (issue 39): the paper keeps the whole framing outside the budget; this "
          "asks which part of it matters, at the paper's decoding.")}

ANALYSIS = Analysis(SPEC, PRESETS, doc=__doc__)
