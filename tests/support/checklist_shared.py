"""Helpers shared by tests/.../test_checklist.py and its model tier (not a test module)."""

from __future__ import annotations

import json

from relaylens.datasets.synthetic_hellobench import bundled_hellobench_path


def short_sample(path, n: int = 2, words: int = 120):
    items = [json.loads(line) for line in bundled_hellobench_path().read_text().splitlines()[:n]]
    for item in items:  # short sources keep the tiny model fast
        text = " ".join(item["raw_text"].split()[:words])
        item["chat_prompt"] = item["chat_prompt"].replace(item["raw_text"], text)
        item["raw_text"] = text
    path.write_text("".join(json.dumps(i) + "\n" for i in items))
    return items
