"""One registry idiom: a name -> object table that other packages can add to through entry points.

Every extension point of relaylens is a :class:`Registry`: selectors (:data:`relaylens.selectors.REGISTRY`),
coordinate conditions (:data:`relaylens.conditions.catalogue.CONDITIONS`), dataset formats
(:data:`relaylens.datasets.REGISTRY`), probe kinds (:data:`relaylens.probes.registry.PROBE_KINDS`), figures and
tables (:data:`relaylens.reporting.figures.registry.REGISTRY`) and benchmarks
(:data:`relaylens.bench.registry.BENCHMARKS`). A registry is a mapping (``in``, ``[]``, ``len``, iteration in
registration order, ``.items()``), and

* an entry is an object or a lazy reference ``"module.path:attribute"``, imported on first use;
* :meth:`Registry.register` adds one (also as a decorator) and refuses a name or alias that is taken, naming both
  owners; :meth:`Registry.alias` adds another name for an entry;
* :meth:`Registry.get` names the known names when a name is unknown;
* :meth:`Registry.frozen` restores the contents on the way out of a ``with`` block (tests, notebooks);
* with ``entry_point_group``, the entry points of that group of every installed distribution join it on first
  lookup or iteration, each under its entry-point name (``[project.entry-points."relaylens.selectors"]
  keep_last = "mypkg.sel:KeepLast"`` in the plugin's ``pyproject.toml``). A plugin that fails to import, or whose
  object is not of the registry's kind, or whose name is taken, is skipped with a warning when the registry is listed,
  and is an error naming its distribution and entry point when it is asked for by name: a broken plugin never stops
  a command that does not use it.

Standard library only, and cheap to import (the command line imports registries at startup); the entry points are
read once, on first use.

Example:
    >>> encoders = Registry("encoder")
    >>> encoders.register("repr", repr, aliases=("r",))
    <built-in function repr>
    >>> @encoders.register("upper")
    ... def upper(value):
    ...     return str(value).upper()
    >>> encoders["r"]("x"), list(encoders), "r" in encoders, len(encoders)
    ("'x'", ['repr', 'upper'], True, 2)
    >>> encoders.register("repr", str.upper)
    Traceback (most recent call last):
    ...
    relaylens.registry.RegistryError: encoder 'repr' is already registered by repr; str.upper cannot register it again. Fix: give the new encoder another name
    >>> with encoders.frozen():
    ...     _ = encoders.register("json", "json:dumps")  # a lazy entry: imported when first asked for
    ...     encoders["json"]([1])
    '[1]'
    >>> encoders.names()
    ['repr', 'upper']
"""  # noqa: E501 - doctest: an exception message is matched on one line

from __future__ import annotations

import importlib
import re
import sys
import warnings
from collections.abc import Callable, Iterator, MutableMapping
from contextlib import contextmanager
from typing import Generic, TypeVar

from relaylens.errors import RelaylensError

__all__ = ["Registry", "RegistryError", "UnknownNameError", "load_reference"]

T = TypeVar("T")

_REFERENCE = re.compile(r"^\s*(?P<module>[\w.]+)\s*(?::\s*(?P<attr>[\w.]+))?\s*(?:\[[^\]]*\])?\s*$")
_MISSING = object()


class RegistryError(RelaylensError):
    """A registration refused (a name or alias already taken, an object of the wrong kind) or an entry that cannot
    be loaded (a broken plugin); the message names the owners and the fix."""


class UnknownNameError(RegistryError, KeyError):
    """A name no entry of the registry has (also a ``KeyError``, as a mapping's missing key is)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


def load_reference(reference: str):
    """The object a ``"module.path:attribute"`` reference names (``"module.path"`` alone: the module; an
    entry point's extras, ``[extra]``, are ignored).

    >>> load_reference("json:dumps").__name__, load_reference("os.path").__name__ in ("posixpath", "ntpath")
    ('dumps', True)
    """
    match = _REFERENCE.match(reference)
    if not match:
        raise RegistryError(f"{reference!r} is not a reference of the form 'module.path:attribute'. Fix: write the "
                            "module's import path, a colon, and the attribute (e.g. 'mypkg.selectors:KeepLast')")
    obj = importlib.import_module(match["module"])
    for part in match["attr"].split(".") if match["attr"] else ():
        obj = getattr(obj, part)
    return obj


class _Entry:
    """One registered name: its object (``target`` holds the reference while it is lazy), who registered it, and,
    for an entry point, the plugin it came from and why it failed to load (once it has)."""

    __slots__ = ("value", "target", "owner", "plugin", "failure")

    def __init__(self, value, target: str | None, owner: str, plugin: bool = False) -> None:
        self.value, self.target, self.owner, self.plugin = value, target, owner, plugin
        self.failure: str | None = None


def _owner_of(obj) -> str:
    """Who registers ``obj``, for messages: a lazy reference, a class or function by its qualified name, else the
    type of the object."""
    if isinstance(obj, str):
        return obj
    qualname, module = getattr(obj, "__qualname__", None), getattr(obj, "__module__", None)
    if isinstance(qualname, str):
        return f"{module}.{qualname}" if isinstance(module, str) and module != "builtins" else qualname
    return f"{type(obj).__module__}.{type(obj).__qualname__}".removeprefix("builtins.")


_SCANS: dict[tuple, list] = {}  # (sys.path, group) -> the group's entry points (read once per search path)


def _entry_points(group: str, fresh: bool = False) -> list:
    """The entry points of ``group`` in the installed distributions (``fresh``: read them again); unreadable
    metadata is a warning, never an error."""
    key = (tuple(sys.path), group)
    if fresh or key not in _SCANS:
        from importlib.metadata import entry_points  # noqa: PLC0415 - import cost: read on first lookup only (CLI startup)

        try:
            _SCANS[key] = list(entry_points(group=group))
        except Exception as err:  # a distribution with broken metadata must not stop relaylens
            warnings.warn(f"relaylens could not read the entry points of the installed distributions "
                          f"({type(err).__name__}: {err}); no {group} plugin is loaded. Fix: repair the environment "
                          "(pip check; reinstall the distribution named above)", stacklevel=4)
            _SCANS[key] = []
    return _SCANS[key]


def _plugin_owner(ep, group: str) -> str:
    """``plugin DIST (entry point NAME = VALUE in group GROUP)``: who a plugin entry belongs to, for messages."""
    try:
        dist = ep.dist.name if getattr(ep, "dist", None) is not None else None
    except Exception:  # unreadable METADATA: the entry point itself still names the plugin
        dist = None
    return f"plugin {dist or 'of an unnamed distribution'} (entry point {ep.name} = {ep.value} in group {group})"


class Registry(MutableMapping, Generic[T]):
    """A name -> object table (see the module docstring).

    Args:
        kind: what an entry is, in messages (``"selector"``, ``"probe kind"``).
        entry_point_group: read the entry points of this group on first lookup or iteration (None: no plugins).
        check: ``check(name, obj)`` raises a :class:`RegistryError` (or another
            :class:`~relaylens.errors.RelaylensError`) when ``obj`` cannot be this registry's entry ``name``; run on
            registration, and on first use for a lazy entry.
    """

    def __init__(self, kind: str, *, entry_point_group: str | None = None,
                 check: Callable[[str, object], None] | None = None) -> None:
        self.kind = kind
        self.entry_point_group = entry_point_group
        self.check = check
        self._entries: dict[str, _Entry] = {}
        self._aliases: dict[str, tuple[str, str]] = {}  # alias -> (name, owner)
        self._scanned = entry_point_group is None

    # -------------------------------------------------------------------------------------------- registering

    def register(self, name: str, obj: T | str | None = None, *, aliases: tuple[str, ...] = (),
                 owner: str | None = None):
        """Register ``obj`` under ``name`` (and ``aliases``); a string is a lazy reference ``"module:attribute"``,
        imported on first use. Without ``obj``, a decorator registering what it decorates. Returns ``obj``.

        A name or alias that is taken is refused (:class:`RegistryError`, naming both owners), as is an object
        ``check`` refuses."""
        if obj is None:
            def decorate(target):
                self.register(name, target, aliases=aliases, owner=owner)
                return target

            return decorate
        owner = owner or _owner_of(obj)
        for taken in (name, *aliases):
            self._refuse_taken(taken, owner)
        if len({name, *aliases}) != 1 + len(aliases):
            raise RegistryError(f"{self.kind} {name!r}: a name or alias is given twice ({[name, *aliases]}). Fix: "
                                "give each once")
        lazy = isinstance(obj, str)
        if not lazy and self.check is not None:
            self.check(name, obj)
        self._entries[name] = _Entry(None if lazy else obj, obj if lazy else None, owner)
        for alias in aliases:
            self._aliases[alias] = (name, owner)
        return obj

    def alias(self, alias: str, name: str, *, owner: str | None = None) -> None:
        """Make ``alias`` another name of the entry ``name`` (refused when ``alias`` is taken)."""
        canonical = self.canonical(name)
        self._refuse_taken(alias, owner or self._entries[canonical].owner)
        self._aliases[alias] = (canonical, owner or self._entries[canonical].owner)

    def unregister(self, name: str) -> None:
        """Remove the entry ``name`` (or the entry an alias names) with its aliases."""
        canonical = self.canonical(name)
        del self._entries[canonical]
        for alias in [a for a, (target, _) in self._aliases.items() if target == canonical]:
            del self._aliases[alias]

    def reorder(self, first) -> None:
        """Put the entries named in ``first`` first, in that order; the others keep their registration order after
        them (names not registered are ignored)."""
        head = {n: self._entries[n] for n in first if n in self._entries}
        rest = {n: e for n, e in self._entries.items() if n not in head}
        self._entries.clear()
        self._entries.update(head)
        self._entries.update(rest)

    def discover(self) -> list[str]:
        """Read the entry points of :attr:`entry_point_group` now (again: a distribution installed since is found)
        and register the new ones, lazily; returns their names. A name already taken is skipped with a warning
        naming both owners. Lookups and iteration do this once by themselves."""
        self._scanned = True
        if self.entry_point_group is None:
            return []
        return self._add_entry_points(_entry_points(self.entry_point_group, fresh=True))

    @contextmanager
    def frozen(self) -> Iterator[Registry[T]]:
        """Inside the ``with`` block, register freely; on the way out (also on an error) the registry holds what it
        held before, plugins read by then included."""
        saved = dict(self._entries), dict(self._aliases), self._scanned
        try:
            yield self
        finally:
            self._entries.clear()
            self._entries.update(saved[0])
            self._aliases.clear()
            self._aliases.update(saved[1])
            self._scanned = saved[2]

    # -------------------------------------------------------------------------------------------- looking up

    def canonical(self, name: str) -> str:
        """The registered name of ``name`` (itself, or the entry an alias names); unknown: :class:`UnknownNameError`
        naming the known names."""
        found = self._find(name)
        if found is None:
            known = ", ".join(self.names()) or "none"
            raise UnknownNameError(f"unknown {self.kind} {name!r}; known: {known}")
        return found

    def get(self, name: str, default=_MISSING) -> T:
        """The object registered as ``name`` (or an alias), imported if lazy. Unknown: ``default`` when given, else
        :class:`UnknownNameError` naming the known names. A plugin that fails to load: :class:`RegistryError` naming
        its distribution and entry point."""
        found = self._find(name)
        if found is None:
            if default is _MISSING:
                self.canonical(name)  # raises, naming the known names
            return default
        return self._resolve(found, self._entries[found])

    def owner(self, name: str) -> str:
        """Who registered ``name``: a module path and object, or ``plugin DIST (entry point ...)``."""
        return self._entries[self.canonical(name)].owner

    def names(self) -> list[str]:
        """The registered names, in registration order (aliases not included)."""
        return list(self)

    def __getitem__(self, name: str) -> T:
        return self.get(name)

    def __contains__(self, name) -> bool:
        return self._find(name) is not None

    def __iter__(self) -> Iterator[str]:
        """Registered names in registration order; plugin entries are loaded here, and one that fails is skipped
        with a warning (asking for it by name raises the error)."""
        self._scan_once()
        for name, entry in list(self._entries.items()):
            if entry.plugin and not self._loads(name, entry):
                continue
            yield name

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __setitem__(self, name: str, obj: T) -> None:
        """``registry[name] = obj``: add or replace (mapping compatibility, e.g. ``monkeypatch.setitem``); use
        :meth:`register` to be refused a taken name."""
        if name in self._aliases:
            raise RegistryError(f"{name!r} is an alias of {self.kind} {self._aliases[name][0]!r}; assign to that name")
        if self.check is not None:
            self.check(name, obj)
        self._entries[name] = _Entry(obj, None, _owner_of(obj))

    def __delitem__(self, name: str) -> None:
        self.unregister(name)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self._entries)})"

    # -------------------------------------------------------------------------------------------- internals

    def _find(self, name) -> str | None:
        """The registered name of ``name`` (an alias resolved), reading the entry points first if it is not here
        yet; None when unknown."""
        if not isinstance(name, str):
            return None
        for attempt in range(2):
            if name in self._aliases:
                return self._aliases[name][0]
            if name in self._entries:
                return name
            if attempt or self._scanned:
                return None
            self._scan_once()
        return None

    def _refuse_taken(self, name: str, owner: str) -> None:
        if not isinstance(name, str) or not name:
            raise RegistryError(f"a {self.kind} name must be non-empty text; got {name!r}")
        previous = (self._entries[name].owner if name in self._entries else
                    self._aliases[name][1] if name in self._aliases else None)
        if previous is not None:
            raise RegistryError(f"{self.kind} {name!r} is already registered by {previous}; {owner} cannot register "
                                f"it again. Fix: give the new {self.kind} another name")

    def _scan_once(self) -> None:
        if not self._scanned:
            self._scanned = True
            self._add_entry_points(_entry_points(self.entry_point_group))

    def _add_entry_points(self, entry_points: list) -> list[str]:
        added = []
        for ep in entry_points:
            owner = _plugin_owner(ep, self.entry_point_group)
            if ep.name in self._entries and self._entries[ep.name].owner == owner:
                continue  # read again by discover(): already here
            try:
                self._refuse_taken(ep.name, owner)
            except RegistryError as err:
                warnings.warn(f"{err} (the plugin's entry is skipped). Fix: rename the entry point in the plugin's "
                              f"pyproject.toml ([project.entry-points.\"{self.entry_point_group}\"])", stacklevel=4)
                continue
            self._entries[ep.name] = _Entry(None, ep.value, owner, plugin=True)
            added.append(ep.name)
        return added

    def _loads(self, name: str, entry: _Entry) -> bool:
        """Whether a plugin entry loads; the first failure is warned about (with the error a lookup raises)."""
        if entry.failure is not None:
            return False
        try:
            self._resolve(name, entry)
        except RegistryError as err:
            warnings.warn(f"{err}; it is skipped", stacklevel=3)
            return False
        return True

    def _resolve(self, name: str, entry: _Entry):
        if entry.target is None:
            return entry.value
        if entry.failure is not None:
            raise RegistryError(entry.failure)
        try:
            obj = load_reference(entry.target)
            if self.check is not None:
                self.check(name, obj)
        except Exception as err:
            if not entry.plugin:
                raise  # relaylens's own entry: a bug, with its traceback
            entry.failure = (f"{self.kind} {name!r} of {entry.owner} cannot be loaded: {type(err).__name__}: {err}. "
                             "Fix: repair or upgrade that distribution, or uninstall it (pip uninstall)")
            raise RegistryError(entry.failure) from err
        entry.value, entry.target = obj, None
        return obj
