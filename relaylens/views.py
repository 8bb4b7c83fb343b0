"""Token-level view: the rendered history, each token shaded by the final question token's attention.

Data (:func:`token_view`, stored by the run for its first ``--view-records`` records as ``RUN_DIR/views/*.json``):
per (record, selector, budget) the history tokens as text, the gold-evidence mask, and per layer the positions kept
by at least one kv head (``kept``) with, per condition, the final question token's attention on them averaged over
query heads (a head whose kv head evicted a token contributes 0). Evicted tokens carry no attention by construction.
Sizes stay bounded: ``layers x kept`` numbers per condition, never ``L x L``.

Rendering (:func:`view_html`): a self-contained HTML fragment (inline JSON + script, no network) with a layer
selector (every layer, plus the early / middle / late bands as means over their layers) and the conditions side by
side (``original`` and ``relay`` first); gold evidence underlined, evicted tokens greyed, retained tokens outlined.
The report embeds it; :func:`show_view` displays it inline in a notebook.

Example:
    >>> view = example_view()
    >>> html = view_html([view])
    >>> "relaylens-token-view" in html, "://" in html
    (True, False)
"""

from __future__ import annotations

import json
from pathlib import Path

from relaylens.summaries import bands

VIEWS = "views"
VIEW_CONDITIONS = ("original", "relay")  # shown first, side by side


def final_token_attention(recorder, selection, history_length: int) -> dict[int, torch.Tensor]:
    """``layer -> [L]`` float32: the final question token's attention on each history position, mean over query heads."""
    import torch

    out = {}
    for layer in sorted(recorder.rows):
        width = recorder.widths[layer]
        row = recorder.rows[layer][:, :width].float()  # [q_head, slot]
        q_heads = row.shape[0]
        kv_heads = selection.positions.shape[1]
        kv_of = torch.arange(q_heads) // (q_heads // kv_heads)
        valid = selection.valid[layer, :, :width][kv_of]  # [q_head, slot]
        positions = selection.positions[layer, :, :width].clamp_min(0)[kv_of]  # [q_head, slot]
        weights = torch.zeros(history_length)
        weights.index_add_(0, positions[valid], row[valid])
        out[layer] = weights / q_heads
    return out


def token_strings(tokenizer, ids: torch.Tensor) -> list[str]:
    """Each history token decoded on its own (what the view prints)."""
    return [tokenizer.decode([int(i)]) for i in ids.reshape(-1).tolist()]


def token_view(prompt, tokenizer, selection, granularity: str, recorders: dict[str, object], key: dict) -> dict:
    """The stored view of one (record, selector, budget): ``recorders`` maps condition -> FinalTokenRecorder."""
    import torch

    length = prompt.history_length
    kept = []  # per layer: positions kept by at least one kv head, ascending
    for layer in range(selection.positions.shape[0]):
        kept.append(torch.unique(selection.positions[layer][selection.valid[layer]]).tolist())
    attention = {}
    for condition, recorder in recorders.items():
        per_layer = final_token_attention(recorder, selection, length)
        attention[condition] = [[float(f"{float(per_layer[l][p]):.4g}") for p in kept[l]] for l in sorted(per_layer)]
    gold = prompt.evidence_mask(granularity)
    return {
        **key, "tokens": token_strings(tokenizer, prompt.history_ids), "gold": [int(i) for i in gold.nonzero().flatten()],
        "kept": kept, "attention": attention, "granularity": granularity,
    }


def view_path(run_dir: str | Path, key: dict) -> Path:
    """``RUN_DIR/views/<record>__<selector>__<budget>.json``."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in str(key["record_id"]))
    return Path(run_dir) / VIEWS / f"{safe}__{key['selector']}__{float(key['budget']):g}.json"


def write_view(run_dir: str | Path, view: dict) -> Path:
    """Write one view atomically (temp file + rename)."""
    path = view_path(run_dir, view)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(view, separators=(",", ":")), encoding="utf-8")
    tmp.replace(path)
    return path


def load_views(run_dir: str | Path, records: int | None = 3) -> list[dict]:
    """Stored views of the first ``records`` records (in the order the run processed them), each unit in order."""
    folder = Path(run_dir) / VIEWS
    if not folder.is_dir():
        return []
    views = [json.loads(p.read_text(encoding="utf-8")) for p in sorted(folder.glob("*.json"))]
    views.sort(key=lambda v: (v.get("order", 0), v["record_id"], v["selector"], float(v["budget"])))
    chosen: list[str] = []
    for v in views:
        if v["record_id"] not in chosen:
            chosen.append(v["record_id"])
    keep = set(chosen if records is None else chosen[:records])
    return [v for v in views if v["record_id"] in keep]


def _layer_options(num_layers: int) -> list[dict]:
    options = [{"label": f"band: {name} (layers {ls[0]}-{ls[-1]})", "layers": ls} for name, ls in bands(num_layers).items() if ls]
    return options + [{"label": f"layer {l}", "layers": [l]} for l in range(num_layers)]


def _escape_json(data) -> str:
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), allow_nan=False)
    for a, b in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("/", "\\/")):
        text = text.replace(a, b)
    return text


_STYLE = """
.rl-tv{font-family:system-ui,sans-serif;font-size:13px}
.rl-tv .rl-tv-cols{display:flex;gap:12px;align-items:flex-start}
.rl-tv .rl-tv-col{flex:1;min-width:0}
.rl-tv .rl-tv-text{white-space:pre-wrap;font-family:ui-monospace,monospace;font-size:11px;line-height:1.7;
  max-height:520px;overflow:auto;border:1px solid #ccc;padding:6px;background:#fff;color:#111}
.rl-tv .rl-tv-text span{border-radius:2px}
.rl-tv .rl-tv-text .ev{color:#9a9a9a}
.rl-tv .rl-tv-text .kp{outline:1px solid #5b7fb8}
.rl-tv .rl-tv-text .gd{text-decoration:underline 2px #c0392b}
.rl-tv .rl-tv-legend span{display:inline-block;margin-right:12px}
"""

_SCRIPT = """
(function(){
  var root=document.getElementById(ROOT_ID);
  var views=JSON.parse(root.querySelector('script[type="application/json"]').textContent);
  var unitSel=root.querySelector('.rl-tv-unit'), layerSel=root.querySelector('.rl-tv-layer');
  var cols=root.querySelector('.rl-tv-cols');
  views.forEach(function(v,i){var o=document.createElement('option');o.value=i;
    o.textContent=v.record_id+' / '+v.selector+' @ '+v.budget;unitSel.appendChild(o);});
  function conditions(v){var names=Object.keys(v.attention).sort(),first=['original','relay'];
    return first.filter(function(c){return names.indexOf(c)>=0;}).concat(names.filter(function(c){return first.indexOf(c)<0;}));}
  function fillLayers(){var v=views[+unitSel.value||0];var keep=layerSel.value;layerSel.innerHTML='';
    v.options.forEach(function(o,i){var e=document.createElement('option');e.value=i;e.textContent=o.label;layerSel.appendChild(e);});
    if(keep&&+keep<layerSel.options.length)layerSel.value=keep;}
  function render(){
    var v=views[+unitSel.value||0],opt=v.options[+layerSel.value||0],conds=conditions(v);
    var n=v.tokens.length,gold=new Uint8Array(n);v.gold.forEach(function(i){gold[i]=1;});
    cols.innerHTML='';
    conds.forEach(function(c){
      var w=new Float64Array(n),kept=new Uint8Array(n);
      opt.layers.forEach(function(l){var ps=v.kept[l],a=v.attention[c][l];
        for(var j=0;j<ps.length;j++){w[ps[j]]+=a[j]/opt.layers.length;kept[ps[j]]=1;}});
      var max=0,vals=[];for(var i=0;i<n;i++){if(w[i]>max)max=w[i];if(kept[i])vals.push(w[i]);}
      vals.sort(function(a,b){return a-b;});
      var scale=vals.length?vals[Math.floor(0.98*(vals.length-1))]:0;if(!(scale>0))scale=max;
      var col=document.createElement('div');col.className='rl-tv-col';
      var h=document.createElement('div');h.textContent=c+' (max weight '+max.toPrecision(3)+')';col.appendChild(h);
      var box=document.createElement('div');box.className='rl-tv-text';box.setAttribute('data-condition',c);
      for(var i=0;i<n;i++){var s=document.createElement('span');s.textContent=v.tokens[i];
        var cls=kept[i]?'kp':'ev';if(gold[i])cls+=' gd';s.className=cls;
        if(kept[i]&&scale>0){var t=Math.min(1,Math.sqrt(w[i]/scale));s.style.backgroundColor='rgba(235,110,0,'+(0.9*t).toFixed(3)+')';}
        s.title=i+': '+w[i].toPrecision(3);box.appendChild(s);}
      col.appendChild(box);cols.appendChild(col);
      var first=box.querySelector('.gd');if(first)box.scrollTop=Math.max(0,first.offsetTop-box.offsetTop-60);});
    root.setAttribute('data-layer',layerSel.value);}
  unitSel.addEventListener('change',function(){fillLayers();render();});
  layerSel.addEventListener('change',render);
  fillLayers();
  var m=/tv-layer=(\\d+)/.exec(location.hash||'');if(m&&+m[1]<layerSel.options.length)layerSel.value=m[1];
  render();
})();
"""


def view_html(views: list[dict], element_id: str = "relaylens-token-view") -> str:
    """A self-contained HTML fragment (style, inline JSON, script) showing ``views``; no network references.

    The layer selector lists the bands first, then every layer; ``#tv-layer=K`` in the page URL preselects option K.
    """
    if not views:
        return ""
    legend = ('<div class="rl-tv-legend"><span>shading: final question token attention (mean over heads; full colour at the 98th percentile)</span>'
              '<span style="text-decoration:underline 2px #c0392b">gold evidence</span>'
              '<span style="outline:1px solid #5b7fb8">retained</span><span style="color:#9a9a9a">evicted</span></div>')
    script = _SCRIPT.replace("ROOT_ID", json.dumps(element_id))
    payload = [dict(v, options=_layer_options(len(v["kept"]))) for v in views]
    return (f'<div class="rl-tv" id="{element_id}"><style>{_STYLE}</style>'
            f'<label>record <select class="rl-tv-unit"></select></label> '
            f'<label>layer <select class="rl-tv-layer"></select></label>{legend}'
            f'<div class="rl-tv-cols"></div>'
            f'<script type="application/json">{_escape_json(payload)}</script><script>{script}</script></div>')


def show_view(run_dir: str | Path, records: int = 3):
    """Display the token view of a run inline in Jupyter (returns an ``IPython.display.HTML``)."""
    from IPython.display import HTML

    return HTML(view_html(load_views(run_dir, records)))


def example_view(tokens: int = 40, layers: int = 3) -> dict:
    """A small constructed view (for examples and tests)."""
    kept = [list(range(0, tokens, 2 + l)) for l in range(layers)]
    attention = {c: [[round((1 + p % 7) / (70.0 * (1 + s)), 4) for p in kept[l]] for l in range(layers)]
                 for s, c in enumerate(("original", "relay"))}
    return {"record_id": "r0", "selector": "bm25", "budget": 0.1, "order": 0, "granularity": "turn",
            "tokens": [f"tok{i} " for i in range(tokens)], "gold": list(range(10, 16)), "kept": kept,
            "attention": attention}
