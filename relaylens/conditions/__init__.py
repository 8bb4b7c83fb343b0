"""The conditions stage: the coordinate conditions (where each kept key sits, where the question starts), scoped
conditions (a condition in some layers or kv heads only), the parser of every condition spec, and the early /
middle / late layer bands.

Owns: :mod:`~relaylens.conditions.catalogue` (the conditions as small frozen dataclasses and
:func:`parse_condition`), :mod:`~relaylens.conditions.scoped` (:class:`Scoped` and :func:`get_condition`, the parser
of every spec, scoped or not), :mod:`~relaylens.conditions.family` (the geometry family: ``b, s, alpha`` per layer and
kv head at real-valued positions, :class:`Geometry`, ``learned:RUN_DIR``), :mod:`~relaylens.conditions.bands` (layer
bands, shared by scopes, probes and figures).

In: a :class:`~relaylens.geometry.selection.Selection` (kept source positions per layer and kv head) and the history
length. Out: :class:`Coordinates` (``key_positions`` ``[layer, kv_head, slot]`` and ``question_start``); the axis
names are those of :mod:`relaylens.geometry`.

May import: :mod:`relaylens.errors`, :mod:`relaylens.registry`, and :mod:`relaylens.geometry` inside functions only.
Importing this package imports no torch and no pandas (the catalogue, labels, spec grammar and bands are plain Python;
coordinates are computed with torch when a selection, itself torch, is given).

Example:
    >>> get_condition("relay@band=late").label, [c.name for c in CONDITIONS.values()][:2]
    ('relay@band=late', ['original', 'relay'])
"""

from relaylens.conditions.bands import BANDS, band_of, bands
from relaylens.conditions.catalogue import (
                                            CONDITIONS,
                                            CommonShift,
                                            Compaction,
                                            Condition,
                                            Coordinates,
                                            HalfGap,
                                            KeyOnly,
                                            Original,
                                            QueryOnly,
                                            RandomOrder,
                                            RankSync,
                                            Relay,
                                            ReverseOrder,
                                            ScoreOrder,
                                            check_coordinates,
                                            make_coordinates,
                                            parse_condition,
)
from relaylens.conditions.family import Geometry, Learned, family_coordinates, family_point
from relaylens.conditions.scoped import (
                                            ALL_LAYER_TYPES,
                                            Scoped,
                                            expand_conditions,
                                            format_layers,
                                            get_condition,
                                            model_layer_types,
                                            parse_scoped,
)

__all__ = ["ALL_LAYER_TYPES", "BANDS", "CONDITIONS", "CommonShift", "Compaction", "Condition", "Coordinates",
           "Geometry", "HalfGap", "KeyOnly", "Learned", "Original", "QueryOnly", "RandomOrder", "RankSync", "Relay",
           "ReverseOrder", "ScoreOrder", "Scoped", "band_of", "bands", "check_coordinates", "expand_conditions",
           "family_coordinates", "family_point", "format_layers", "get_condition", "make_coordinates",
           "model_layer_types", "parse_condition", "parse_scoped"]
