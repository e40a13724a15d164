"""Strict, bounded YAML for study files: data plus the line of every key and item.

PyYAML composes a file into a graph of nodes in which an alias (``*a``) is the very node its
anchor (``&a``) names, so a few hundred bytes can describe billions of nodes once the aliases
are followed (the "billion laughs"). :func:`load_yaml` therefore bounds the graph while it is
composed (depth, alias references) and *before* anything walks it expanded: the number of
nodes and the depth the aliases expand to are computed once per distinct node, a structure
that contains itself is refused, and only then are the Python data built and the line index
made. It is also strict where PyYAML is lenient: a key given twice in one mapping is an error,
and so is a NUL character in a string.

Every refusal is a :class:`~tunelab.errors.StudyError` naming the file and line.
"""

from __future__ import annotations

import math
from typing import Any

import yaml

from tunelab.errors import StudyError
from tunelab.limits import LIMITS

__all__ = ["Lines", "load_yaml"]

Lines = dict[tuple[Any, ...], int]
"""Line (1-based) of each key path, e.g. ``("parameters", "np")`` -> 7."""

_MERGE_TAG = "tag:yaml.org,2002:merge"


class _Refused(Exception):
    """A bound or strictness rule broken at a mark; becomes a StudyError with the line."""

    def __init__(self, mark: yaml.Mark | None, message: str) -> None:
        super().__init__(message)
        self.mark = mark


# libyaml's parser where PyYAML has it (the pure-Python scanner takes seconds for a 1 MiB
# file); the events feed PyYAML's Python composer either way, so the bounds below apply.
try:
    from yaml.cyaml import CParser as _Parser
except ImportError:  # pragma: no cover - PyYAML built without libyaml
    from yaml.parser import Parser
    from yaml.reader import Reader
    from yaml.scanner import Scanner

    class _PyParser(Reader, Scanner, Parser):
        def __init__(self, stream: str) -> None:
            Reader.__init__(self, stream)
            Scanner.__init__(self)
            Parser.__init__(self)

    _Parser = _PyParser


class _Loader(yaml.composer.Composer, _Parser, yaml.constructor.SafeConstructor,
              yaml.resolver.Resolver):
    """A safe loader with bounded nesting, node and alias counts, no duplicate keys, no
    NUL."""

    def __init__(self, stream: str) -> None:
        _Parser.__init__(self, stream)
        yaml.composer.Composer.__init__(self)
        yaml.constructor.SafeConstructor.__init__(self)
        yaml.resolver.Resolver.__init__(self)
        self._depth = 0
        self._aliases = 0
        self._nodes = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        self._nodes += 1
        if self._nodes > LIMITS.yaml_nodes:
            raise _Refused(self.peek_event().start_mark,
                           f"more than {LIMITS.yaml_nodes:,} YAML nodes")
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > LIMITS.yaml_aliases:
                raise _Refused(self.peek_event().start_mark,
                               f"more than {LIMITS.yaml_aliases:,} alias references (*name)")
            node: yaml.Node = super().compose_node(parent, index)
            return node
        self._depth += 1
        if self._depth > LIMITS.yaml_depth:
            raise _Refused(self.peek_event().start_mark,
                           f"nested more than {LIMITS.yaml_depth} levels deep")
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        if isinstance(node, yaml.ScalarNode) and "\x00" in node.value:
            raise _Refused(node.start_mark, "a NUL character (\\0) is not allowed in a string")
        return node

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG or not isinstance(key_node, yaml.ScalarNode):
                continue
            key = self.construct_object(key_node)
            if key in seen:
                raise _Refused(key_node.start_mark, f"key {key!r} is given twice in one "
                                                    "mapping")
            seen.add(key)
        result: dict[Any, Any] = super().construct_mapping(node, deep=deep)
        return result

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, TypeError, AttributeError, OverflowError):
            value = node.value if isinstance(node, yaml.ScalarNode) else ""
            raise _Refused(node.start_mark, f"{shorten(repr(value))} cannot be read as "
                                            f"{node.tag.rsplit(':', 1)[-1]}") from None

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        """An integer, refused before it is converted when it has more digits than
        ``LIMITS.integer_bits`` allow (Python refuses to convert one of over 4,300 digits)."""
        digits = sum(ch.isalnum() for ch in node.value)
        if digits > _INT_DIGITS:
            raise _Refused(node.start_mark, f"an integer of {digits:,} digits; at most "
                                            f"{_INT_DIGITS:,} (a {LIMITS.integer_bits}-bit "
                                            "number)")
        value: int = super().construct_yaml_int(node)
        if value.bit_length() > LIMITS.integer_bits:
            raise _Refused(node.start_mark, f"an integer larger than {LIMITS.integer_bits} "
                                            "bits")
        return value


_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int)
_INT_DIGITS = int(LIMITS.integer_bits * math.log10(2)) + 1
"""Decimal digits of the largest integer a study file may give (``LIMITS.integer_bits``)."""
_KEYS = yaml.constructor.SafeConstructor()
"""Builds the Python value of a scalar key for the line index (``1`` -> 1, ``on`` -> True)."""


def shorten(text: str, width: int = 60) -> str:
    """``text`` cut for an error message."""
    return text if len(text) <= width else text[:width - 1] + "…"


def load_yaml(text: str, source: str) -> tuple[Any, Lines]:
    """The data of the YAML ``text`` and the line of each key path; ``source`` names the
    file in errors. Raises :class:`StudyError` for malformed or over-limit YAML."""
    loader = None
    try:
        loader = _Loader(text)
        node = loader.get_single_node()
        if node is None:
            return None, {}
        _check_expansion(node)
        data = loader.construct_document(node)
    except _Refused as exc:
        raise _located(source, exc.mark, str(exc)) from None
    except yaml.reader.ReaderError as exc:  # a character YAML does not allow: no mark
        line = text.count("\n", 0, exc.position) + 1
        raise StudyError(f"{source}:{line}: malformed YAML: {str(exc).splitlines()[0]}") \
            from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        context = getattr(exc, "context", None) or ""
        first = getattr(exc, "context_mark", None)
        if context.startswith("found duplicate anchor") and first is not None:
            problem = f"{context.split(';')[0]} (first on line {first.line + 1})"
        if "maximum nesting depth" in problem:  # PyYAML 6.0.4's libyaml: its own bound, first
            raise _located(source, mark, f"nested more than {LIMITS.yaml_depth} levels deep "
                                         f"({problem})") from None
        raise _located(source, mark, f"malformed YAML: {problem}") from None
    except RecursionError:  # a safety net: the bounds above keep every walk shallow
        raise StudyError(f"{source}: YAML nested too deeply") from None
    finally:
        if loader is not None:
            loader.dispose()
    return data, _index_lines(node)


def _located(source: str, mark: yaml.Mark | None, message: str) -> StudyError:
    where = f"{source}:{mark.line + 1}" if mark is not None else source
    return StudyError(f"{where}: {message}")


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _check_expansion(root: yaml.Node) -> None:
    """Refuse a graph whose alias expansion exceeds the node or depth limit, or that
    contains itself. Linear in the number of distinct nodes (each is sized once)."""
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            on_path.discard(key)
            kids = _children(node)
            size[key] = 1 + sum(size[id(k)] for k in kids)
            depth[key] = 1 + max((depth[id(k)] for k in kids), default=0)
            if size[key] > LIMITS.yaml_nodes:
                raise _Refused(node.start_mark,
                               f"more than {LIMITS.yaml_nodes:,} YAML nodes once its aliases "
                               "are expanded")
            if depth[key] > LIMITS.yaml_depth:
                raise _Refused(node.start_mark,
                               f"nested more than {LIMITS.yaml_depth} levels deep once its "
                               "aliases are expanded")
            continue
        if key in size:
            continue
        if key in on_path:
            raise _Refused(node.start_mark, "an alias refers to the node that contains it "
                                            "(a structure that contains itself)")
        on_path.add(key)
        stack.append((node, True))
        stack.extend((kid, False) for kid in _children(node) if id(kid) not in size)


def _index_lines(root: yaml.Node) -> Lines:
    """Line of every key path; a node reached again through an alias is not walked again
    (its own line stands for what lies below it)."""
    out: Lines = {(): root.start_mark.line + 1}
    walked: set[int] = set()
    stack: list[tuple[yaml.Node, tuple[Any, ...]]] = [(root, ())]
    while stack:
        node, path = stack.pop()
        if id(node) in walked:
            continue
        walked.add(id(node))
        below: list[tuple[yaml.Node, tuple[Any, ...]]] = []
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                sub = (*path, _key_of(key))
                out.setdefault(sub, key.start_mark.line + 1)
                below.append((value, sub))
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                sub = (*path, i)
                out.setdefault(sub, item.start_mark.line + 1)
                below.append((item, sub))
        stack.extend(reversed(below))  # walked in file order: a node's first use names it
    return out


def _key_of(node: yaml.Node) -> Any:
    """A key as the data holds it (``1`` and ``on`` are 1 and True there), so that errors
    about a key find its line."""
    if not isinstance(node, yaml.ScalarNode):
        return f"<{node.tag}>"
    make = yaml.constructor.SafeConstructor.yaml_constructors.get(node.tag)
    try:
        value = make(_KEYS, node) if make is not None else node.value
        hash(value)
    except Exception:  # noqa: BLE001 - any key that cannot be rebuilt is indexed as written
        return node.value
    return value
