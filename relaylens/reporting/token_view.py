"""Token-level view: the rendered history, each token shaded by the final question token's attention.

Rendering (:func:`view_html`) of the views a run stored (:mod:`relaylens.results.views`; captured by
:mod:`relaylens.probes.token_view`): a self-contained HTML fragment (inline JSON + script, no network) with a layer
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

from relaylens.conditions.bands import bands
from relaylens.reporting.htmlsafe import json_script
from relaylens.results.views import load_views

VIEW_CONDITIONS = ("original", "relay")  # shown first, side by side


def _layer_options(num_layers: int) -> list[dict]:
    options = [{"label": f"band: {name} (layers {ls[0]}-{ls[-1]})", "layers": ls} for name,
               ls in bands(num_layers).items() if ls]
    return options + [{"label": f"layer {l}", "layers": [l]} for l in range(num_layers)]


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
    return first.filter(function(c){return names.indexOf(c)>=0;}).concat(names.filter(function(c){return
    first.indexOf(c)<0;}));}
  function fillLayers(){var v=views[+unitSel.value||0];var keep=layerSel.value;layerSel.innerHTML='';
    v.options.forEach(function(o,i){var
    e=document.createElement('option');e.value=i;e.textContent=o.label;layerSel.appendChild(e);});
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
        if(kept[i]&&scale>0){var
        t=Math.min(1,Math.sqrt(w[i]/scale));s.style.backgroundColor='rgba(235,110,0,'+(0.9*t).toFixed(3)+')';}
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
    legend = ('<div class="rl-tv-legend"><span>shading: final question token attention (mean over heads; full colour '
              'at the 98th percentile)</span><span style="text-decoration:underline 2px #c0392b">gold evidence</span>'
              '<span style="outline:1px solid #5b7fb8">retained</span><span style="color:#9a9a9a">evicted</span></div>')
    script = _SCRIPT.replace("ROOT_ID", json.dumps(element_id))
    payload = [dict(v, options=_layer_options(len(v["kept"]))) for v in views]
    return (f'<div class="rl-tv" id="{element_id}"><style>{_STYLE}</style>'
            f'<label>record <select class="rl-tv-unit"></select></label> '
            f'<label>layer <select class="rl-tv-layer"></select></label>{legend}'
            f'<div class="rl-tv-cols"></div>'
            f'<script type="application/json">{json_script(payload)}</script><script>{script}</script></div>')


def show_view(run_dir: str | Path, records: int = 3):
    """Display the token view of a run inline in Jupyter (returns an ``IPython.display.HTML``)."""
    from IPython.display import HTML  # noqa: PLC0415 - optional extra: IPython (Jupyter only)

    return HTML(view_html(load_views(run_dir, records)))


def example_view(tokens: int = 40, layers: int = 3) -> dict:
    """A small constructed view (for examples and tests)."""
    kept = [list(range(0, tokens, 2 + l)) for l in range(layers)]
    attention = {c: [[round((1 + p % 7) / (70.0 * (1 + s)), 4) for p in kept[l]] for l in range(layers)]
                 for s, c in enumerate(("original", "relay"))}
    return {"record_id": "r0", "selector": "bm25", "budget": 0.1, "order": 0, "granularity": "turn",
            "tokens": [f"tok{i} " for i in range(tokens)], "gold": list(range(10, 16)), "kept": kept,
            "attention": attention}
