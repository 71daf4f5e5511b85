"""Who keeps a tensor alive: a short Python path, found by walking referrers a few levels up.

Breadth-first over ``gc.get_referrers`` from the sample tensors, one scan of the heap per level
(all samples at once), through containers (lists, tuples, dicts, sets, deques, cells), until an
*anchor* that has a name: an attribute of an object (``Runner.recent_batches``), a module global
(``train.CACHE``), a class attribute, a closure, or a local of a finished frame kept by a
traceback. The name ends with the type of the container that holds the tensors: ``TinyGPT.leak_store
(list)``. ``nn.Module``'s ``_buffers['x']`` reads as ``.x``.

A running frame's locals are invisible to the garbage collector, so a tensor held only by a
local of the training loop is looked up, as a last resort, in the current thread's stack
(``frame.f_locals``; before Python 3.13 that materialises a snapshot of the frame's locals that
lives until the frame's next snapshot or its end, so it is done only when nothing else named the
holder). Runs on the training thread only; costs one heap scan per level (``MAX_DEPTH`` at most).

The names end up in the job's log, in dumps and on ``/debug/memory``, so a string key is shown only
when it reads like a name from code (``names.py``): anything else (a cache keyed by an API key, a
user id, a file path) reads ``['<redacted 32 chars>']``.
"""

from __future__ import annotations

import collections
import gc
import os
import re
import sys
import types
import weakref
from collections.abc import Iterable, Sequence
from typing import Any

from memexporter.diagnose.names import attribute, subscript

MAX_DEPTH = 8
MAX_FRONTIER = 128
_THROUGH = (list, tuple, dict, set, frozenset, collections.deque, types.CellType)
_OPAQUE = (weakref.ref, weakref.ProxyType, types.MethodType, types.BuiltinFunctionType, types.ModuleType)
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_MODULE_DICTS = re.compile(r"\._(?:buffers|parameters|modules)\['([^']+)'\]")
_DICT_KEY = "\0key"  # the label of a string dict key: rendered by _segment(), which knows the path above it


class _Node:
    """``obj`` holds ``below`` (None for a sample) through ``label`` (``[*]``, ``[0]``, or
    ``_DICT_KEY``); ``key`` is the raw dict key, used when ``obj`` turns out to be an object's
    ``__dict__``."""

    __slots__ = ("below", "key", "label", "obj", "origins")

    def __init__(self, obj: Any, below: _Node | None, label: str, key: object, origins: set[int]) -> None:
        self.obj, self.below, self.label, self.key, self.origins = obj, below, label, key, origins


def _segment(path: str, node: _Node) -> str:
    if node.label != _DICT_KEY:
        return node.label
    # nn.Module's own dicts are keyed by attribute names; any other dict by data.
    code = path.endswith(("._buffers", "._parameters", "._modules"))
    return subscript(str(node.key), code)


def _render(base: str, node: _Node) -> str:
    """``base`` plus the subscripts down to the innermost container, whose type ends the name."""
    path = base
    while node.below is not None and node.below.below is not None:
        path += _segment(path, node)
        node = node.below
    if node.below is not None and path.endswith(("._buffers", "._parameters")):
        path += _segment(path, node)  # a registered buffer or parameter: name it, it is no container
        node = node.below
    return _MODULE_DICTS.sub(r".\1", path) + f" ({type(node.obj).__name__})"


def _label(container: Any, child: Any) -> tuple[str, object]:
    if isinstance(container, dict):
        for k, v in container.items():
            if v is child:
                return (_DICT_KEY if isinstance(k, str) else "[*]"), k
        return "[key]", None
    if isinstance(container, tuple):
        for i, v in enumerate(container):
            if v is child:
                return f"[{i}]", i
    return "[*]", None


def _short(qualname: str) -> str:
    """``make.<locals>.step`` -> ``step``: where a class or function was defined is noise here."""
    return qualname.rsplit("<locals>.", 1)[-1]


def _code_name(code: types.CodeType) -> str:
    return _short(getattr(code, "co_qualname", code.co_name))


def _instance_dict(obj: Any) -> dict[str, Any] | None:
    try:  # object.__getattribute__: a class's own __getattr__/__getattribute__ must not run
        d = object.__getattribute__(obj, "__dict__")
    except Exception:
        return None
    return d if isinstance(d, dict) else None


def _anchor(ref: Any, child: _Node) -> tuple[str, _Node] | None:
    """``(name, node to render from)`` when ``ref``, which holds ``child.obj``, is a named place."""
    obj, below = child.obj, child.below
    own_dict = below is not None and isinstance(obj, dict) and isinstance(child.key, str)
    if isinstance(ref, types.ModuleType):
        return (
            (f"{ref.__name__}.{attribute(str(child.key))}", below) if own_dict and below and vars(ref) is obj else None
        )
    if isinstance(ref, type):
        if own_dict and below and vars(ref).get(str(child.key)) is below.obj:
            return f"{_short(ref.__qualname__)}.{attribute(str(child.key))}", below
        return None
    if isinstance(ref, types.FrameType):  # a finished frame, kept by a traceback
        code = ref.f_code
        name = attribute(next((k for k, v in ref.f_locals.items() if v is obj), "?"))
        return f"{_code_name(code)}() local {name}", child
    if isinstance(ref, (types.GeneratorType, types.CoroutineType)):
        return f"{_short(ref.__qualname__)}() (a suspended generator's local)", child
    if isinstance(ref, types.FunctionType):
        if obj is ref.__closure__ and below is not None and isinstance(child.key, int) and below.below is not None:
            # closure tuple -> cell -> value: name the free variable, skip the tuple and the cell.
            return f"{_short(ref.__qualname__)}() closure {ref.__code__.co_freevars[child.key]}", below.below
        return (f"{_short(ref.__qualname__)}() default argument", child) if obj is ref.__defaults__ else None
    cls = type(ref).__name__
    d = _instance_dict(ref)
    if d is not None:
        if d is obj:
            return (f"{cls}.{attribute(str(child.key))}", below) if own_dict and below else None
        attr = next((k for k, v in d.items() if v is obj), None)
        if attr is not None:
            return f"{cls}.{attribute(str(attr))}", child
    for klass in type(ref).__mro__:
        for slot in getattr(klass, "__slots__", ()):
            if isinstance(slot, str) and getattr(ref, slot, None) is obj:
                return f"{cls}.{slot}", child
    return None


def _walks_through(ref: Any) -> bool:
    # Functions and classes are anchors or dead ends: every function refers to its module's
    # globals, and walking through them would flood the frontier.
    return not isinstance(ref, (_Node, type, types.FunctionType, types.FrameType, *_OPAQUE))


def find_holders(samples: Sequence[Any], ignore: Iterable[object] = ()) -> list[list[str]]:
    """For each sample, the names of what keeps it alive (the shallowest found; may be empty)."""
    skip = {id(o) for o in ignore} | {id(samples)}
    starts = [_Node(s, None, "", None, {i}) for i, s in enumerate(samples)]
    found: list[list[str]] = [[] for _ in samples]
    nodes: dict[int, _Node] = {id(n.obj): n for n in starts}
    reached: dict[int, set[int]] = {id(s): {i} for i, s in enumerate(samples)}
    frontier = list(starts)
    for _ in range(MAX_DEPTH):
        if not frontier:
            break
        by_id: dict[int, list[_Node]] = {}
        for n in frontier:
            by_id.setdefault(id(n.obj), []).append(n)
        objs = [n.obj for n in frontier]
        refs = gc.get_referrers(*objs)
        skip |= {id(objs), id(refs)}
        nxt: list[_Node] = []
        for ref in refs:
            if id(ref) in skip or isinstance(ref, _Node):
                continue
            if isinstance(ref, types.FrameType) and ref.f_code.co_filename.startswith(_PACKAGE):
                continue
            # A container already walked for these samples is not walked again (cycles); one
            # reached from other samples later is, for them.
            done = reached.setdefault(id(ref), set())
            for child in (c for x in gc.get_referents(ref) for c in by_id.get(id(x), ())):
                origins = child.origins - done
                if not origins:
                    continue
                anchor = _anchor(ref, child)
                if anchor is not None:
                    name = _render(*anchor)
                    for origin in origins:
                        if name not in found[origin]:
                            found[origin].append(name)
                elif _walks_through(ref):
                    label, key = _label(ref, child.obj)
                    if not isinstance(ref, _THROUGH):
                        label = f"<{type(ref).__name__}>"
                    node = _Node(ref, child, label, key, origins)
                    nodes.setdefault(id(ref), node)
                    nxt.append(node)
                done |= origins
        del refs, objs
        open_origins = {i for i, names in enumerate(found) if not names}
        frontier = [n for n in nxt if n.origins & open_origins][:MAX_FRONTIER]
    _from_stack(found, nodes)
    return found


def _depth(node: _Node) -> int:
    depth = 0
    while node.below is not None:
        node, depth = node.below, depth + 1
    return depth


def _from_stack(found: list[list[str]], nodes: dict[int, _Node]) -> None:
    """Last resort for samples with no holder: a local of a running frame on this thread's stack.
    The container closest to the root wins (a loop's ``kept`` list over a helper's argument)."""
    if all(found):
        return
    best: dict[int, tuple[int, str]] = {}
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None:
        if not frame.f_code.co_filename.startswith(_PACKAGE):
            for var, value in list(frame.f_locals.items()):
                node = nodes.get(id(value))
                if node is None or node.obj is not value:
                    continue
                depth = _depth(node)
                for origin in node.origins:
                    if not found[origin] and depth > best.get(origin, (-1, ""))[0]:
                        best[origin] = (depth, _render(f"{_code_name(frame.f_code)}() local {var}", node))
        frame = frame.f_back
    for origin, (_, name) in best.items():
        found[origin].append(name)
